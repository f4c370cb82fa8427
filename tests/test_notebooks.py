"""The Colab notebooks run top to bottom (nbclient) on tiny local models, with their parameters overridden the
way papermill does it (a cell injected after the one tagged "parameters"), and their outputs are checked."""

import importlib.util
from pathlib import Path

import pytest

from _helpers import char_tokenizer, tiny_target
from dart_hf import DartDraftModel

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the test extras (nbformat, nbclient)")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need the test extras (nbformat, nbclient)")

EXAMPLES = Path(__file__).parent.parent / "examples"
spec = importlib.util.spec_from_file_location("make_notebooks", EXAMPLES / "make_notebooks.py")
make_notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_notebooks)

PROMPTS = [f"say {word} twice" for word in ("apple", "river", "stone", "cloud", "green", "seven", "north", "piano")]


@pytest.fixture(autouse=True)
def private_dart_cache(tmp_path, monkeypatch):
    # the notebook kernel is another process: conftest's patch of the cost cache does not reach it, the variable does
    monkeypatch.setenv("DART_HF_CACHE", str(tmp_path / "dart-hf-cache"))


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("assets")
    target = tiny_target("llama", seed=3)
    target.save_pretrained(folder / "target")
    char_tokenizer().save_pretrained(folder / "target")
    DartDraftModel.from_target(target).save_pretrained(folder / "draft")
    return folder


def run_notebook(name: str, parameters: str, workdir: Path) -> str:
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    index = next(i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", []))
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(parameters))
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}})
    client.execute()
    texts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", "") or "".join(output.get("data", {}).get("text/plain", "")))
    return "\n".join(texts)


def test_notebooks_are_built_from_the_scripts():
    for script in make_notebooks.SCRIPTS:
        built = nbformat.writes(make_notebooks.notebook_from_script(EXAMPLES / script)) + "\n"
        assert (EXAMPLES / script.replace(".py", ".ipynb")).read_text(encoding="utf-8") == built, script
        notebook = nbformat.reads(built, as_version=4)
        nbformat.validate(notebook)
        assert "!pip install" in notebook.cells[0].source  # the Colab install cell opens every notebook


def test_quickstart_notebook(tiny_assets, tmp_path):
    output = run_notebook(
        "quickstart.ipynb",
        f"TARGET = {str(tiny_assets / 'target')!r}\nDRAFT = {str(tiny_assets / 'draft')!r}\nNGRAM = None\n"
        "PROMPT = 'say hello'\nMAX_NEW_TOKENS = 24",
        tmp_path,
    )
    target = tiny_target("llama", seed=3)
    tokenizer = char_tokenizer()
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "say hello"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    vanilla = target.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(vanilla[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert f"answer: {answer}" in output  # the notebook's answer is the target's own
    assert "tau: " in output and "identical to vanilla: True" in output and "speedup over vanilla generate" in output


def test_train_your_own_draft_notebook(tiny_assets, tmp_path):
    output = run_notebook(
        "train_your_own_draft.ipynb",
        f"TARGET = {str(tiny_assets / 'target')!r}\nPROMPTS = {PROMPTS * 4!r}\nMAX_NEW_TOKENS = 24\nMAX_STEPS = 30\n"
        f"OUTPUT_DIR = {str(tmp_path / 'my-draft')!r}\nHUB_REPO = None",
        tmp_path,
    )
    assert "held-out alpha_1" in output and "identical to vanilla: True" in output and "tau: " in output
    assert (tmp_path / "my-draft" / "model.safetensors").exists()
    assert (tmp_path / "my-draft" / "selfdistill.jsonl").read_text().count("\n") == len(PROMPTS) * 4


def test_ngram_effect_notebook(tiny_assets, tmp_path):
    output = run_notebook(
        "ngram_effect.ipynb",
        f"TARGET = {str(tiny_assets / 'target')!r}\nDRAFT = {str(tiny_assets / 'draft')!r}\n"
        f"TABLE_PROMPTS = {PROMPTS!r}\nTEST_PROMPTS = {PROMPTS[:2]!r}\nMAX_NEW_TOKENS = 24",
        tmp_path,
    )
    assert "tau without table" in output and "tau with table" in output and "3-grams" in output
