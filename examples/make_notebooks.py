"""Build the Colab notebooks from the plain scripts beside them (the scripts are the source of truth).

Each script is in the "percent" format: `# %%` starts a code cell, `# %% [markdown]` a markdown cell whose lines
are comments, and `# %% tags=["parameters"]` the cell of settings (the tests override it). Every notebook opens
with the install cell a Colab user needs.

    python examples/make_notebooks.py          # rewrite examples/*.ipynb
    python examples/make_notebooks.py --check  # fail if a notebook is out of date
"""

import argparse
import json
import sys
from pathlib import Path

import nbformat

SCRIPTS = ["quickstart.py", "train_your_own_draft.py", "ngram_effect.py"]
INSTALL_CELL = """# On Colab: install dart-hf from its source tree (no release is on PyPI yet): upload or clone the dart-hf
# folder and set DART_HF_SOURCE to it. Colab's own torch is kept. Elsewhere, install it once as the README says
# and skip this cell.
import sys

DART_HF_SOURCE = "/content/dart-hf"
if "google.colab" in sys.modules:
    !pip install -q "{DART_HF_SOURCE}[zoo]"
"""


def notebook_from_script(path: Path) -> nbformat.NotebookNode:
    """The notebook of one percent-format script, with the Colab install cell first."""
    cells = [nbformat.v4.new_code_cell(INSTALL_CELL)]
    for block in path.read_text(encoding="utf-8").split("# %%")[1:]:
        header, _, body = block.partition("\n")
        body = body.strip("\n")
        if header.strip() == "[markdown]":
            text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.split("\n"))
            cells.append(nbformat.v4.new_markdown_cell(text))
            continue
        cell = nbformat.v4.new_code_cell(body)
        if header.strip().startswith("tags="):
            cell.metadata["tags"] = json.loads(header.strip().removeprefix("tags="))
        cells.append(cell)
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata.update(
        {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
            "colab": {"provenance": []},
            "accelerator": "GPU",
        }
    )
    for index, cell in enumerate(notebook.cells):  # stable ids, so rebuilding an unchanged script changes nothing
        cell.id = f"cell-{index}"
    return notebook


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    here = Path(__file__).parent
    stale = []
    for script in SCRIPTS:
        text = nbformat.writes(notebook_from_script(here / script)) + "\n"
        target = here / script.replace(".py", ".ipynb")
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target}")
    if stale:
        sys.exit(f"out of date: {', '.join(stale)}; run python examples/make_notebooks.py")


if __name__ == "__main__":
    main()
