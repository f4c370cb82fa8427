"""Files: written so that a crash never leaves a half-written one (to a temporary name, then renamed into place),
and the dart-hf cache with the PyPI archives downloaded into it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Call `write(temporary_path)` to write the file, then rename it to `path` (atomic on one filesystem). The
    temporary name carries the process id, so concurrent writers never share one."""
    path = Path(path)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    write(str(temporary))
    with_default_permissions(temporary)
    os.replace(temporary, path)


def with_default_permissions(path: str | os.PathLike) -> None:
    """Give `path` the permissions a new file or folder gets from this process's umask (0644 / 0755 under the
    usual 022). safetensors writes through a temporary file that it creates private (0600), and `mkdtemp` makes a
    private folder: drafts and tables written so could not be read by another user, such as a vLLM server's."""
    umask = os.umask(0o022)  # reading the umask sets it: set it straight back
    os.umask(umask)
    path = Path(path)
    path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def extend_lines(path: str | os.PathLike, lines: list[str]) -> None:
    """Make `path` hold `lines`, one per line, where it holds a first part of them or nothing: for files whose line
    numbers are ids that other files refer to (a prompt file and its self-distilled replies), which may only grow.
    Raises ValueError, and writes nothing, where the file holds other lines."""
    path = Path(path)
    existing = path.read_text(encoding="utf-8").split("\n")[:-1] if path.exists() else []
    if lines[: len(existing)] != existing:
        raise ValueError(f"{path} does not start with the lines to be written: its line numbers (ids) would move.")
    if len(lines) > len(existing):
        write_atomically(path, lambda temporary: Path(temporary).write_text("\n".join(lines) + "\n", encoding="utf-8"))


def cache_root() -> Path:
    """The dart-hf cache folder: `$DART_HF_CACHE`, default `~/.cache/dart-hf`."""
    return Path(os.environ.get("DART_HF_CACHE", Path.home() / ".cache" / "dart-hf"))


def download_distribution(requirement: str, sdist: bool = False) -> Path:
    """The archive of a pinned requirement, fetched once into the cache with `pip download --no-deps`."""
    folder = cache_root() / "packages"
    name, version = requirement.split("==")
    stem = f"{name}_{version}_".replace("-", "_").lower()  # archive names: name-version-... or name-version.tar.gz

    def matches(path: Path) -> bool:
        return (path.name.lower().replace("-", "_").replace(".tar.gz", "_") + "_").startswith(stem)

    found = [p for p in folder.glob("*") if matches(p)] if folder.exists() else []
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", requirement, "-d", str(folder)]
        if sdist:
            command += ["--no-binary", ":all:"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"pip download {requirement} failed: {result.stderr.strip()[-500:]}")
        found = [p for p in folder.glob("*") if matches(p)]
    if not found:
        raise FileNotFoundError(f"pip download {requirement} produced no archive in {folder}.")
    return found[0]
