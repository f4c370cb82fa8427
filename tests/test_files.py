"""`dart_hf.files`: atomic writes, and files of id-numbered lines that may only grow."""

import os
import stat

import numpy as np
import pytest
from safetensors.numpy import save_file

from dart_hf.files import extend_lines, with_default_permissions, write_atomically


def default_mode(path) -> int:
    """The permission bits a new file or folder gets from this process's umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return (0o777 if os.path.isdir(path) else 0o666) & ~umask


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_write_atomically_leaves_no_temporary_file(tmp_path):
    write_atomically(tmp_path / "a.txt", lambda temporary: open(temporary, "w").write("done"))
    assert (tmp_path / "a.txt").read_text() == "done" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_files_written_atomically_get_the_umasks_permissions_not_safetensors_private_ones(tmp_path):
    """safetensors writes through a temporary file created private (0600): a table or cache written so could not
    be read by another user (a vLLM server's, a container's)."""
    save_file({"a": np.zeros(2)}, str(tmp_path / "plain.safetensors"))
    assert mode(tmp_path / "plain.safetensors") == 0o600  # why the helper exists; if safetensors changes, fine too
    write_atomically(tmp_path / "t.safetensors", lambda temporary: save_file({"a": np.zeros(2)}, temporary))
    assert mode(tmp_path / "t.safetensors") == default_mode(tmp_path / "t.safetensors")
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    with_default_permissions(folder)
    assert mode(folder) == default_mode(folder)


def test_extend_lines_creates_grows_and_refuses_to_move_ids(tmp_path):
    path = tmp_path / "prompts.jsonl"
    extend_lines(path, ["a", "b"])
    assert path.read_text() == "a\nb\n"
    extend_lines(path, ["a", "b", "c"])  # a longer draw of the same sequence appends
    assert path.read_text() == "a\nb\nc\n"
    extend_lines(path, ["a", "b", "c"])  # the same draw writes nothing
    assert path.read_text() == "a\nb\nc\n"
    with pytest.raises(ValueError, match="does not start with the lines to be written"):
        extend_lines(path, ["a", "x", "c", "d"])
    assert path.read_text() == "a\nb\nc\n"
