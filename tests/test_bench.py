"""The benchmark harness on a tiny target: every method runs, DART is checked against vanilla, files are written."""


import random

import dart_hf.bench as bench
from _helpers import char_tokenizer, tiny_target
from dart_hf import DartDraftModel


def test_run_benchmark_summary_table_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)])
    target = tiny_target("llama", seed=3)
    draft = DartDraftModel.from_target(target)
    tokenizer = char_tokenizer()
    summary = bench.run_benchmark(
        target, tokenizer, draft, ["set-a", "set-b"], prompts_per_set=2, max_new_tokens=16,
        methods=["vanilla", "prompt_lookup", "dart_chain", "dart_no_ngram", "dart_no_lookup", "dart"],
    )
    assert set(summary) == {"set-a", "set-b", "overall", *bench.RUN_ENTRIES}
    assert (summary["prompts_done"], summary["prompts_planned"], summary["sittings"]) == (4, 4, 1)
    assert summary["machine"]["dtype"] == "float32" and "near_ties" in summary["overall"]["dart"]
    overall = summary["overall"]
    assert overall["vanilla"]["speedup_total"] == 1.0 and overall["dart"]["prompts"] == 4
    assert overall["dart"]["greedy_mismatches"] == 0 and overall["dart"]["tau"] >= 1.0
    assert overall["dart_chain"]["greedy_mismatches"] == 0 and overall["dart_chain"]["prompts"] == 4
    assert abs(sum(overall["dart"]["time_split"].values()) - 1.0) < 1e-9
    no_lookup = overall["dart_no_lookup"]
    assert no_lookup["greedy_mismatches"] == 0 and no_lookup["lookup_fraction"] == 0
    assert no_lookup["time_split"]["lookup"] == 0
    low, high = overall["dart"]["speedup_total_ci95"]
    assert low <= overall["dart"]["speedup_total"] <= high and len(overall["dart"]["seconds"]) == 4
    alpha = overall["dart"]["draft_alpha"]
    assert len(alpha) == draft.config.draft_length and all(0.0 <= a <= 1.0 for a in alpha)
    assert summary["set-a"]["dart_no_ngram"]["draft_alpha"] == summary["set-a"]["dart"]["draft_alpha"]
    table = bench.markdown_table(summary)
    assert "| overall |" in table and "dart speedup (tau)" in table and "alpha_1" in table
    assert "{:.2f}-{:.2f}]".format(low, high) in table
    bench.plot(summary, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_arms_run_their_own_drafts_and_options_beside_the_methods(monkeypatch):
    """Two DART arms (a second draft object, and the first with other options) interleaved with vanilla: each with
    its own stats and draft's agreement, held to vanilla's greedy output; a name that is a method is refused."""
    import pytest

    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)])
    target = tiny_target("llama", seed=3)
    draft = DartDraftModel.from_target(target)
    other = DartDraftModel.from_target(target)  # another random draft: another agreement with vanilla
    arms = {"fixed_4": (draft, {"adaptive": False, "budget": 4}), "other": (other, {})}
    summary = bench.run_benchmark(target, char_tokenizer(), None, ["set-a"], prompts_per_set=3, max_new_tokens=12,
                                  methods=["vanilla"], arms=arms)
    overall = summary["overall"]
    assert set(overall) == {"vanilla", "fixed_4", "other"}
    assert overall["fixed_4"]["greedy_mismatches"] == 0 and overall["other"]["greedy_mismatches"] == 0
    assert overall["fixed_4"]["budget_chosen"] == 4 and overall["fixed_4"]["plain_fraction"] == 0
    assert len(overall["fixed_4"]["draft_alpha"]) == len(overall["other"]["draft_alpha"]) == draft.config.draft_length
    assert summary["weights_beside_target"]["other"] > 0 and summary["weights_beside_target"]["vanilla"] == 0
    with pytest.raises(ValueError, match="are method names"):
        bench.run_benchmark(target, char_tokenizer(), None, ["set-a"], 1, 4, methods=["vanilla"],
                            arms={"dart": (draft, {})})


def test_a_bfloat16_run_times_vanilla_float32_and_judges_divergences_by_near_ties(tmp_path, monkeypatch):
    """DART and vanilla in bfloat16 beside vanilla float32: speedups over both, and every greedy output either
    identical to vanilla bfloat16's or diverging at a near-tie of the target's own logits."""
    import torch

    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)])
    tiny_target("llama", seed=3).save_pretrained(tmp_path / "target")
    target = type(tiny_target()).from_pretrained(tmp_path / "target", dtype=torch.bfloat16).eval()
    draft = DartDraftModel.from_target(target)
    summary = bench.run_benchmark(target, char_tokenizer(), draft, ["set-a"], prompts_per_set=4, max_new_tokens=48,
                                  methods=["vanilla", "vanilla_float32", "dart"])
    assert summary["machine"]["dtype"] == "bfloat16"
    dart = summary["overall"]["dart"]
    assert dart["speedup_over_float32_total"] > 0 and "speedup_over_float32_total" in summary["set-a"]["vanilla"]
    judged = dart["near_ties"]
    assert judged["prompts"] == 4 and judged["real_divergences"] == 0
    assert judged["identical"] + judged["near_tie_divergences"] == 4
    assert "over float32" in bench.markdown_table(summary) and "real divergences" in bench.markdown_table(summary)


def test_methods_run_in_reverse_order_on_every_other_prompt(monkeypatch):
    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)])
    target = tiny_target("llama", seed=3)
    draft = DartDraftModel.from_target(target)
    calls = []
    generate = target.generate

    def recording_generate(*args, **kwargs):
        if "assistant_model" in kwargs:
            calls.append("dart")
        else:
            calls.append("lookup" if "prompt_lookup_num_tokens" in kwargs else "vanilla")
        return generate(*args, **kwargs)

    monkeypatch.setattr(target, "generate", recording_generate)
    bench.run_benchmark(
        target, char_tokenizer(), draft, ["set-a"], prompts_per_set=3, max_new_tokens=4,
        methods=["vanilla", "prompt_lookup", "dart"],
    )
    timed = calls[3:]  # after one untimed warm-up per method
    assert timed == ["vanilla", "lookup", "dart", "dart", "lookup", "vanilla", "vanilla", "lookup", "dart"]


def test_each_dart_method_keeps_its_own_evidence_and_the_warm_up_leaves_none(monkeypatch):
    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)])
    target = tiny_target("llama", seed=3)
    draft = DartDraftModel.from_target(target)
    seen = []  # (method, its evidence object, how many verified steps it holds) at the start of every DART call
    generate = target.generate

    def recording_generate(*args, **kwargs):
        if "assistant_model" in kwargs:
            evidence = draft.controller_state.evidence
            method = "dart_no_lookup" if kwargs["tree_options"].get("lookup_length") == 0 else "dart"
            seen.append((method, evidence, len(evidence.current.acceptance)))
        return generate(*args, **kwargs)

    monkeypatch.setattr(target, "generate", recording_generate)
    bench.run_benchmark(
        target, char_tokenizer(), draft, ["set-a"], prompts_per_set=3, max_new_tokens=12,
        methods=["vanilla", "dart_no_lookup", "dart"],
    )
    warm_up, timed = seen[:2], seen[2:]
    assert [length for _, _, length in warm_up] == [0, 0]  # each method's warm-up starts from nothing
    assert [length for _, _, length in timed[:2]] == [0, 0]  # ... and so does its first timed call
    timed_evidence = {method: [evidence for name, evidence, _ in timed if name == method]
                      for method in ("dart", "dart_no_lookup")}
    for method, evidence in timed_evidence.items():
        assert all(e is evidence[0] for e in evidence), method  # one evidence per method, kept across prompts
        assert not any(evidence[0] is e for _, e, _ in warm_up), method  # not the warm-up's
    assert timed_evidence["dart"][0] is not timed_evidence["dart_no_lookup"][0]
    assert all(length > 0 for _, _, length in timed[2:])


def test_the_sets_take_turns_prompt_by_prompt(monkeypatch):
    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)][:2])
    chat_inputs, asked = bench.chat_inputs, []

    def recording_chat_inputs(tokenizer, prompt):
        asked.append(prompt)
        return chat_inputs(tokenizer, prompt)

    monkeypatch.setattr(bench, "chat_inputs", recording_chat_inputs)
    target = tiny_target("llama", seed=3)
    summary = bench.run_benchmark(target, char_tokenizer(), None, ["a", "b", "c"], prompts_per_set=3,
                                  max_new_tokens=2, methods=["vanilla"])
    assert asked[1:] == ["a prompt 0", "b prompt 0", "c prompt 0", "a prompt 1", "b prompt 1", "c prompt 1"]
    assert list(bench.result_sets(summary)) == ["a", "b", "c", "overall"]


def test_a_run_in_sittings_resumes_where_it_stopped_with_its_evidence(tmp_path, monkeypatch):
    """A sitting stopped by max_minutes after each prompt: three sittings give the prompts, tokens and greedy checks
    of one whole run, carry each DART method's controller evidence over, and say so; other settings are refused."""
    import pytest

    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)])
    target = tiny_target("llama", seed=3)
    draft = DartDraftModel.from_target(target)
    path = tmp_path / "run.sitting.pt"
    run = dict(prompts_per_set=3, max_new_tokens=12, methods=["vanilla", "prompt_lookup", "dart"])
    whole = bench.run_benchmark(target, char_tokenizer(), draft, ["set-a"], **run)
    seen = []  # how many verified steps the draft's evidence holds at the start of every DART call
    generate = target.generate

    def recording_generate(*args, **kwargs):
        if "assistant_model" in kwargs:
            seen.append(len(draft.controller_state.evidence.current.acceptance))
        return generate(*args, **kwargs)

    monkeypatch.setattr(target, "generate", recording_generate)
    for sitting in (1, 2, 3):
        summary = bench.run_benchmark(target, char_tokenizer(), draft, ["set-a"], **run, sitting_path=path,
                                      max_minutes=1e-9)
        assert (summary["prompts_done"], summary["sittings"]) == (sitting, sitting)
        if sitting < 3:
            assert f"Unfinished: {sitting} of 3 prompts" in bench.markdown_table(summary)
    warm_ups, timed = seen[0::2], seen[1::2]  # per sitting: the untimed warm-up, then one prompt
    assert warm_ups == [0, 0, 0] and timed[0] == 0
    assert timed[1] > 0 and timed[2] > 0  # the next sittings start from the evidence the last one saved
    assert "Run in 3 sittings" in bench.markdown_table(summary)
    for method in run["methods"]:
        assert summary["overall"][method]["tokens"] == whole["overall"][method]["tokens"]
        assert summary["overall"][method]["prompts"] == 3
    assert summary["overall"]["dart"]["greedy_mismatches"] == 0
    assert summary["overall"]["dart"]["draft_alpha"] == whole["overall"]["dart"]["draft_alpha"]
    with pytest.raises(ValueError, match="other max_new_tokens"):
        bench.run_benchmark(target, char_tokenizer(), draft, ["set-a"], **{**run, "max_new_tokens": 8},
                            sitting_path=path)


def test_a_sitting_is_not_resumed_on_another_machine(tmp_path, monkeypatch):
    """A sitting's timings belong to its machine: a resume on another processor is refused, naming both."""
    import pytest

    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)])
    target = tiny_target("llama", seed=3)
    path = tmp_path / "run.sitting.pt"
    run = dict(prompts_per_set=2, max_new_tokens=4, methods=["vanilla"], sitting_path=path, max_minutes=1e-9)
    monkeypatch.setattr(bench, "device_description", lambda device: "Intel Xeon [amx_bf16]")
    assert bench.run_benchmark(target, char_tokenizer(), None, ["set-a"], **run)["prompts_done"] == 1
    monkeypatch.setattr(bench, "device_description", lambda device: "AMD EPYC [no bf16 units]")
    with monkeypatch.context() as refused_run:
        # refused before the warm-up: on a real model the warm-up alone takes minutes
        refused_run.setattr(target, "generate", lambda *args, **kwargs: pytest.fail("warm-up ran before the check"))
        with pytest.raises(ValueError, match=r"timed on Intel Xeon \[amx_bf16\], not on this one \(AMD EPYC"):
            bench.run_benchmark(target, char_tokenizer(), None, ["set-a"], **run)
    monkeypatch.setattr(bench, "device_description", lambda device: "Intel Xeon [amx_bf16]")
    assert bench.run_benchmark(target, char_tokenizer(), None, ["set-a"], **run)["prompts_done"] == 2


def test_speedups_are_per_new_token_and_a_sampled_run_has_no_greedy_check():
    # sampled outputs may end at different lengths: half the time for half the tokens is no speedup
    vanilla = bench.MethodResult(seconds=[2.0, 2.0], tokens=[10, 10])
    dart = bench.MethodResult(checked=True, seconds=[1.0, 1.0], tokens=[5, 5], taus=[1.5, 1.5], verify_steps=4,
                              tree_kinds=["drawn", "drawn", "drawn", "tree"])
    summary = bench.summarise({"set-a": {"vanilla": vanilla, "dart": dart}}, sampled=True)
    row = summary["set-a"]["dart"]
    assert row["speedup_total"] == 1.0 and row["speedup_median"] == 1.0 and row["speedup_total_ci95"] == [1.0, 1.0]
    assert row["greedy_mismatches"] is None and row["tokens"] == [5, 5]
    assert row["drawn_fraction"] == 0.75 and "75% drawn" in bench.markdown_table(summary)
    greedy = bench.summarise({"set-a": {"vanilla": vanilla, "dart": bench.MethodResult(
        checked=True, seconds=[1.0, 1.0], tokens=[10, 10], verify_steps=4)}})["overall"]["dart"]
    assert greedy["speedup_total"] == 2.0 and greedy["greedy_mismatches"] == 0


def test_calls_slowed_by_other_work_are_counted_and_flagged():
    vanilla = bench.MethodResult(seconds=[1.0, 1.1, 0.9, 3.2], tokens=[10, 10, 10, 10])  # the last: 3.2x the median
    dart = bench.MethodResult(seconds=[0.5, 0.6, 0.4, 1.4], tokens=[5, 5, 5, 10])  # per token 1.4 / 10 is no outlier
    summary = bench.summarise({"set-a": {"vanilla": vanilla, "dart": dart}})
    assert summary["set-a"]["vanilla"]["slow_calls"] == 1 and summary["set-a"]["dart"]["slow_calls"] == 0
    assert "slow_calls" not in summary["overall"]["vanilla"]
    assert "set-a vanilla 1." in bench.markdown_table(summary)
    vanilla.seconds[-1] = 2.9
    assert "median seconds" not in bench.markdown_table(bench.summarise({"set-a": {"vanilla": vanilla}}))


def test_bootstrap_interval_holds_the_estimate_and_widens_with_noise():
    assert bench.bootstrap_interval([2.0] * 10, [1.0] * 10) == [2.0, 2.0]  # no spread, no uncertainty
    rng = random.Random(0)
    vanilla = [1.0 + rng.random() for _ in range(20)]
    quiet = [v / 1.1 * (1 + 0.01 * rng.uniform(-1, 1)) for v in vanilla]
    noisy = [v / 1.1 * (1 + 0.20 * rng.uniform(-1, 1)) for v in vanilla]
    low, high = bench.bootstrap_interval(vanilla, quiet)
    assert low < sum(vanilla) / sum(quiet) < high and 1.08 < low and high < 1.12
    noisy_low, noisy_high = bench.bootstrap_interval(vanilla, noisy)
    assert noisy_high - noisy_low > 3 * (high - low)


def test_the_peers_assisted_and_prompt_lookup_run_beside_dart_and_match_vanilla(monkeypatch):
    """Transformers' assisted decoding (a smaller model with the same vocabulary) and prompt lookup, interleaved
    with vanilla and DART, each held to vanilla's greedy output."""
    import pytest

    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)])
    target = tiny_target("llama", seed=3)
    assistant = tiny_target("llama", seed=4, num_hidden_layers=2)  # the same 128-token vocabulary
    draft = DartDraftModel.from_target(target)
    methods = ["vanilla", "assisted", "prompt_lookup", "dart"]
    summary = bench.run_benchmark(target, char_tokenizer(), draft, ["set-a"], prompts_per_set=3, max_new_tokens=24,
                                  methods=methods, assistant=assistant)
    overall = summary["overall"]
    for method in ("assisted", "prompt_lookup", "dart"):
        assert overall[method]["prompts"] == 3 and overall[method]["greedy_mismatches"] == 0, method
        assert overall[method]["near_ties"]["identical"] == 3
    assert "assisted speedup (tau)" in bench.markdown_table(summary)
    weights = summary["weights_beside_target"]
    assert weights["vanilla"] == weights["prompt_lookup"] == 0
    assert weights["assisted"] == sum(p.numel() * 4 for p in assistant.parameters())
    assert 0 < weights["dart"] == sum(p.numel() * 4 for p in draft.parameters())
    assert "Weights held beside the target's: assisted" in bench.markdown_table(summary)
    with pytest.raises(ValueError, match="needs an assistant model"):
        bench.run_benchmark(target, char_tokenizer(), draft, ["set-a"], 1, 8, methods=["vanilla", "assisted"])


def test_bench_command_loads_the_assistant_and_asks_for_one_where_it_has_no_default(tmp_path, monkeypatch, capsys):
    import json

    import pytest

    monkeypatch.setattr(bench, "load_prompts", lambda name, limit: [f"{name} prompt {i}" for i in range(limit)])
    for name, layers in (("target", 6), ("assistant", 2)):
        tiny_target("llama", seed=3, num_hidden_layers=layers).save_pretrained(tmp_path / name)
        char_tokenizer().save_pretrained(tmp_path / name)
    common = ["--target", str(tmp_path / "target"), "--sets", "set-a", "--prompts-per-set", "1",
              "--max-new-tokens", "8", "--methods", "vanilla", "assisted", "--out", str(tmp_path / "run")]
    bench.main(common + ["--assistant", str(tmp_path / "assistant")])
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["overall"]["assisted"]["greedy_mismatches"] == 0
    with pytest.raises(ValueError, match="--methods assisted needs --assistant"):
        bench.main(common)
