"""The README and docs/: every relative link and every repository path they name exists (a benchmark's `--out`
prefix counts when its JSON report does)."""

import itertools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_LEVEL = ("src", "tests", "benchmarks", "examples", "docs", "model_cards", ".ci")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./{},*-]*[\w}*/])" % "|".join(re.escape(top) for top in TOP_LEVEL))


def expand_braces(path: str) -> list[str]:
    """`a.{json,md}` -> [`a.json`, `a.md`] (every brace group, as a shell expands them)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[part] if index % 2 == 0 else part.split(",") for index, part in enumerate(parts)]
    return ["".join(combination) for combination in itertools.product(*choices)]


def named_paths(document: Path) -> list[tuple[str, Path]]:
    text = document.read_text()
    found = []
    for target in LINK.findall(text):
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            found.append((target, (document.parent / target.split("#")[0]).resolve()))
    for path in PATH.findall(text):
        for expanded in expand_braces(path.rstrip(".,")):
            found.append((expanded, ROOT / expanded))
    return found


def git_ignored(path: Path) -> bool:
    """Git ignores the path here, so a fresh clone will not have it (outside a git checkout: False)."""
    try:
        return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT, capture_output=True).returncode == 0
    except OSError:
        return False


def in_a_fresh_clone(path: Path) -> bool:
    return path.exists() and not git_ignored(path)


def resolves(path: Path) -> bool:
    """The path is in a fresh clone (a glob: matches such a file), or is a benchmark's `--out` prefix (its `.json`
    report is, or an unfinished run's `.sitting.pt` state)."""
    if "*" in path.name:
        return any(in_a_fresh_clone(match) for match in path.parent.glob(path.name))
    return any(in_a_fresh_clone(path.with_name(path.name + suffix)) for suffix in ("", ".json", ".sitting.pt"))


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_link_and_path_resolves(document):
    missing = [name for name, path in named_paths(document) if not resolves(path)]
    assert not missing, f"{document.name} names paths a fresh clone does not have: {missing}"


def test_the_checker_finds_links_and_paths(tmp_path):
    document = tmp_path / "doc.md"
    document.write_text("see [x](other.md) and `benchmarks/results/run{1,2}.json`, and [web](https://example.com)")
    names = [name for name, _ in named_paths(document)]
    assert names == ["other.md", "benchmarks/results/run1.json", "benchmarks/results/run2.json"]
    assert not resolves(ROOT / "docs" / "no-such-page.md") and resolves(ROOT / "docs" / "README.md")
    assert git_ignored(ROOT / "benchmarks" / "results" / "run.sitting.pt")
    assert not git_ignored(ROOT / "docs" / "README.md")
