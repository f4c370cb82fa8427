"""`dart_hf.files`: atomic writes, and files of id-numbered lines that may only grow."""

import pytest

from dart_hf.files import extend_lines, write_atomically


def test_write_atomically_leaves_no_temporary_file(tmp_path):
    write_atomically(tmp_path / "a.txt", lambda temporary: open(temporary, "w").write("done"))
    assert (tmp_path / "a.txt").read_text() == "done" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


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
