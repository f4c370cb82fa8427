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
