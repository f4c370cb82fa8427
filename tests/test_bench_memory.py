"""benchmarks/bench_memory.py: each method, loaded and run as its process would, reports its memory and decodes
vanilla's tokens (tiny random models, float32)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import bench_memory  # noqa: E402

from _helpers import char_tokenizer, tiny_target  # noqa: E402
from dart_hf import DartDraftModel  # noqa: E402


def test_every_method_reports_its_memory_and_vanillas_tokens(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_memory, "prompt_texts", lambda count: [f"prompt {i}: say abc" for i in range(count)])
    for name, layers in (("target", 6), ("assistant", 2)):
        tiny_target("llama", seed=3, num_hidden_layers=layers).save_pretrained(tmp_path / name)
        char_tokenizer().save_pretrained(tmp_path / name)
    target, _ = bench_memory.load_target(str(tmp_path / "target"), dtype=None, device="cpu")
    DartDraftModel.from_target(target).save_pretrained(tmp_path / "draft")
    args = argparse.Namespace(target=str(tmp_path / "target"), assistant=str(tmp_path / "assistant"),
                              draft=str(tmp_path / "draft"), dtype="float32", prompts=2, max_new_tokens=12)
    rows = {method: bench_memory.measure_method(method, args) for method in bench_memory.METHODS}
    for method, row in rows.items():
        assert row["outputs"] == rows["vanilla"]["outputs"], method
        assert len(row["outputs"]) == 2 and all(len(output) > 0 for output in row["outputs"])
        assert 0 < row["resident_loaded_mib"] <= row["resident_peak_decoding_mib"] <= row["process_peak_mib"]
        assert 0 < row["anonymous_peak_mib"] <= row["process_peak_mib"]
        assert row["target_weights_mib"] == rows["vanilla"]["target_weights_mib"] > 0
    beside = {method: row["weights_beside_target_bytes"] for method, row in rows.items()}
    assert beside["vanilla"] == beside["prompt_lookup"] == 0 and beside["assisted"] > 0 and beside["dart"] > 0


def test_memory_sizes_count_mapped_file_pages_as_resident_not_anonymous(tmp_path):
    import mmap

    from _common import memory_sizes

    path = tmp_path / "mapped.bin"
    path.write_bytes(b"\1" * (64 * 2**20))
    resident_before, anonymous_before = memory_sizes()
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        checksum = sum(mapped[offset] for offset in range(0, len(mapped), 4096))  # touch every page
        resident, anonymous = memory_sizes()
    assert checksum == 64 * 2**20 // 4096
    assert resident - resident_before >= 48 * 2**20
    assert anonymous - anonymous_before < 16 * 2**20
