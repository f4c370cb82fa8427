"""Measured forward costs: interpolation, padding to a cheaper size, both layouts, calibration and its disk cache."""

import pytest

from _helpers import tiny_target
from dart_hf import DartDraftModel
from dart_hf import costs as costs_module
from dart_hf.costs import (
    ForwardCosts,
    calibrate_batch_forward_costs,
    calibrate_draft_costs,
    calibrate_forward_costs,
    calibration_key,
)


def test_forward_costs_interpolate_and_extrapolate():
    costs = ForwardCosts([1, 9, 17], [1.0, 2.0, 4.0])
    assert costs(1) == 1.0 and costs(5) == pytest.approx(1.5) and costs(13) == pytest.approx(3.0)
    assert costs(25) == pytest.approx(6.0)  # the last segment's slope


def test_draft_costs_are_measured_per_level_count():
    draft = DartDraftModel.from_target(tiny_target("llama"))
    costs = calibrate_draft_costs(draft, repeats=1)
    assert len(costs.seconds) == draft.config.draft_length and all(seconds > 0 for seconds in costs.seconds)


def test_calibration_measures_once_and_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(costs_module, "cache_root", lambda: tmp_path)
    target = tiny_target("llama")
    costs = calibrate_forward_costs(target, [2, 3, 4], max_nodes=17, context_length=16, repeats=1)
    assert costs.node_counts[0] == 1 and costs.node_counts[-1] == 17 and all(s > 0 for s in costs.seconds)
    assert calibration_key(target) in (tmp_path / "forward_costs.json").read_text()

    def no_forward(*args, **kwargs):
        raise AssertionError("the cached calibration should have been used")

    monkeypatch.setattr(costs_module, "forward_tree", no_forward)
    again = calibrate_forward_costs(target, [2, 3, 4], max_nodes=17, context_length=16, repeats=1)
    assert again == costs


def test_calibration_keeps_a_size_that_measures_cheaper_than_a_smaller_one(tmp_path, monkeypatch):
    # as a 2-core CPU's float32 matmuls do: 3 nodes slower than 4 or 5 (146 ms against 116-122 ms)
    monkeypatch.setattr(costs_module, "cache_root", lambda: tmp_path)
    seconds_by_nodes = {1: 0.077, 2: 0.129, 3: 0.146, 4: 0.116, 5: 0.122, 6: 0.140, 7: 0.153, 8: 0.120, 9: 0.125}
    clock = [0.0]
    real_forward = costs_module.forward_tree

    def timed_forward(target, tree, *args, **kwargs):  # the real forward, on a clock that reads the given costs
        clock[0] += seconds_by_nodes[len(tree)]
        return real_forward(target, tree, *args, **kwargs)

    monkeypatch.setattr(costs_module, "forward_tree", timed_forward)
    monkeypatch.setattr(costs_module.time, "perf_counter", lambda: clock[0])
    costs = calibrate_forward_costs(tiny_target("llama"), [2, 3, 4], max_nodes=9, context_length=16, repeats=2)
    assert dict(zip(costs.node_counts, costs.seconds)) == pytest.approx(seconds_by_nodes)
    assert costs(4) < costs(3)


def test_calibration_measures_both_layouts_and_keeps_each_on_disk(tmp_path, monkeypatch):
    """Weight-major forwards timed at half the usual time at 2-4 nodes and twice it elsewhere: the costs say
    weight-major where it measured faster, and the cached calibration gives the same back."""
    monkeypatch.setattr(costs_module, "cache_root", lambda: tmp_path)
    usual = {1: 0.06, 2: 0.09, 3: 0.11, 4: 0.10, 5: 0.09, 6: 0.10, 7: 0.11, 8: 0.10, 9: 0.11}
    clock, layouts = [0.0], []
    real_forward = costs_module.forward_tree

    def timed_forward(target, tree, cache, feature_layers, rows=None, weight_major=False):
        nodes = len(tree)
        layouts.append(weight_major)
        clock[0] += usual[nodes] * ((0.5 if 2 <= nodes <= 4 else 2.0) if weight_major else 1.0)
        return real_forward(target, tree, cache, feature_layers, rows, weight_major)

    monkeypatch.setattr(costs_module, "forward_tree", timed_forward)
    monkeypatch.setattr(costs_module.time, "perf_counter", lambda: clock[0])
    target = tiny_target("llama")
    costs = calibrate_forward_costs(target, [2, 3, 4], max_nodes=9, context_length=16, repeats=2)
    assert layouts.count(True) == layouts.count(False) == 9 * 3
    assert [costs.weight_major(n) for n in range(1, 10)] == [n in (2, 3, 4) for n in range(1, 10)]
    assert costs(3) == pytest.approx(0.055) and costs(6) == pytest.approx(0.10)
    assert calibrate_forward_costs(target, [2, 3, 4], max_nodes=9, context_length=16, repeats=2) == costs
    assert len(layouts) == 9 * 3 * 2  # the second call read the disk


def test_forwards_are_padded_to_a_cheaper_measured_size_up_to_max_rows():
    """This CPU's shape: 2-4 rows cost more than 5, 9 more than 13."""
    measured = ([1, 2, 3, 4, 5, 9, 13], [1.0, 1.7, 2.1, 1.45, 1.37, 1.85, 1.7])
    costs = ForwardCosts(*measured, max_rows=9)
    assert [costs.rows(n) for n in range(1, 6)] == [1, 5, 5, 5, 5]
    assert costs(3) == costs.measured(5) == 1.37 and costs.measured(3) == 2.1
    assert costs.rows(6) == 6  # 1.49 interpolated: 9 nodes are dearer, 13 lie beyond max_rows
    assert costs.rows(9) == 9 and costs.rows(40) == 40
    assert ForwardCosts(*measured, max_rows=13).rows(9) == 13
    unpadded = ForwardCosts(*measured)
    assert unpadded.rows(3) == 3 and unpadded(3) == 2.1
    # where every size costs about the same (a GPU), calibration noise pads nothing
    assert ForwardCosts([1, 5, 61], [1.0, 1.02, 1.0], max_rows=61).rows(5) == 5


def test_each_size_runs_and_costs_as_its_faster_layout():
    """Weight-major products (`dart_hf.weight_major`) measured faster at 2-5 rows, as on this CPU: those sizes cost
    the weight-major time and run weight-major; the others keep the usual layout and its time."""
    counts = [1, 2, 3, 4, 5, 9, 17]
    usual = [1.0, 1.5, 1.8, 1.6, 1.5, 1.7, 2.0]
    major = [1.05, 1.0, 1.2, 1.0, 1.2, 1.9, 2.6]
    costs = ForwardCosts(counts, usual, weight_major_seconds=major)
    assert [costs.weight_major(n) for n in counts] == [False, True, True, True, True, False, False]
    assert [costs(n) for n in counts] == [1.0, 1.0, 1.2, 1.0, 1.2, 1.7, 2.0]
    assert costs(7) == pytest.approx(min(1.6, 1.55))  # between measured sizes: the cheaper interpolation
    assert not ForwardCosts(counts, usual).weight_major(3)  # not measured: the usual layout
    # padding looks at each size's faster layout: 3 nodes run as 4 weight-major rows
    padded = ForwardCosts(counts, usual, max_rows=9, weight_major_seconds=major)
    assert padded.rows(3) == 4 and padded.weight_major(padded.rows(3)) and padded(3) == 1.0


def test_batch_calibration_is_per_row_per_batch_size_and_cached_on_disk(tmp_path, monkeypatch):
    """Costs per row at the candidate budgets' sizes, kept on disk per batch size."""
    monkeypatch.setattr(costs_module, "cache_root", lambda: tmp_path)
    target = tiny_target("llama")
    costs = calibrate_batch_forward_costs(target, [2, 3, 4], batch_size=4, max_nodes=9, context_length=16, repeats=1)
    assert costs.node_counts == [1, 2, 3, 4, 5, 7, 9] and all(s > 0 for s in costs.seconds)
    assert "batch=4" in (tmp_path / "forward_costs.json").read_text()
    def no_forward(*args, **kwargs):
        raise AssertionError("the cached calibration should have been used")

    monkeypatch.setattr(costs_module.ragged, "forward_rows", no_forward)
    assert calibrate_batch_forward_costs(target, [2, 3, 4], 4, 9, context_length=16, repeats=1) == costs
    with pytest.raises(AssertionError):  # another batch size is measured anew
        calibrate_batch_forward_costs(target, [2, 3, 4], 2, 9, context_length=16, repeats=1)
