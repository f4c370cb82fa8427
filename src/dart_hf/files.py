"""Writing files so that a crash never leaves a half-written one: to a temporary name, then renamed into place."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Call `write(temporary_path)` to write the file, then rename it to `path` (atomic on one filesystem). The
    temporary name carries the process id, so concurrent writers never share one."""
    path = Path(path)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    write(str(temporary))
    os.replace(temporary, path)


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
