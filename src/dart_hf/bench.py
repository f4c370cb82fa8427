"""The benchmark harness: DART against vanilla `generate` and the peers Transformers offers (prompt lookup
decoding, assisted decoding with a smaller model of the same tokenizer), side by side.

Methods run interleaved prompt by prompt (the same prompts, the same process, the order reversed on every other
prompt; the sets take turns, one prompt each), so machine noise hits all of them alike. A long run goes in sittings
(`--max-minutes`; the same command resumes it). Speed is reported as ratios to vanilla `generate`'s seconds per
new token in the bench's dtype (`--dtype`, the target's): the median of per-prompt ratios and the total-time ratio
(greedy outputs are the same tokens for every method, so these are plain time ratios; sampled ones may end at
different lengths), and, in a low-precision run, over vanilla float32 too. Every greedy output of DART and the
peers is checked against vanilla's in the same dtype: identical in float32; in bfloat16 or float16 each divergence is judged a
near-tie or a real disagreement by the target's own logits (`dart_hf.near_ties`). The draft's teacher-forced
agreement with vanilla's greedy output (alpha_k) is reported per set. Each method first runs once untimed on a
prompt of its own (first-call setup and DART's one-time cost calibration stay out of the timings).

    dart-hf bench --draft smollm2-135m-instruct-dart            # 20 prompts per set, 32 new tokens, greedy
    dart-hf bench --draft smollm2-135m-instruct-dart --quick    # 2 prompts per set
    dart-hf bench --draft smollm2-135m-instruct-dart --sample   # T=1: no greedy check, no alpha
    dart-hf bench --draft smollm2-135m-instruct-dart --dtype bfloat16   # against vanilla bfloat16 and float32
    dart-hf bench --target qwen2.5-coder-1.5b-instruct --draft DRAFT --dtype bfloat16 \
        --methods vanilla assisted prompt_lookup dart                   # the peers, the 0.5B as the assistant
    dart-hf bench ... --max-minutes 50                                  # a sitting; rerun the same to go on
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .arguments import positive_int, short_usage
from .files import write_atomically
from .hardware import device_clock, device_description
from .modeling_dart import DartDraftModel
from .near_ties import NearTieReport, describe
from .prompts import PROMPT_SETS, load_prompts
from .training.trainer import greedy_agreement
from .zoo import load_draft, load_target

BENCHMARK_SETS = [name for name, prompt_set in PROMPT_SETS.items() if prompt_set.role == "benchmark"]
WARM_UP_PROMPT = "Say hello."  # not from any prompt set
# a call this many times slower per new token than its method's median on the set is flagged: between what clean
# runs reach and what calls slowed by other work on the machine take (`docs/benchmarks.md`, "Slow calls")
SLOW_CALL_FACTOR = 3.0
METHODS = [
    "vanilla", "vanilla_bf16", "vanilla_float32", "prompt_lookup", "assisted", "dart_chain", "dart_no_ngram",
    "dart_no_lookup", "dart_fixed_drafts", "dart_drawn_only", "dart",
]
# a summary's entries about the whole run, beside its per-set rows
RUN_ENTRIES = ("machine", "weights_beside_target", "prompts_done", "prompts_planned", "sittings")
PEER_METHODS = ["prompt_lookup", "assisted"]  # what Transformers offers instead: prompt lookup, a small assistant
# the assistant `--methods assisted` uses by default for a zoo target: a smaller model with the same tokenizer
ASSISTANTS = {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-0.5b-instruct"}
DEFAULT_METHODS = ["vanilla", "vanilla_bf16", "prompt_lookup", "dart_no_ngram", "dart"]
# a run whose target is not float32 compares with vanilla float32 in place of vanilla bfloat16
LOW_PRECISION_METHODS = ["vanilla", "vanilla_float32", "prompt_lookup", "dart_no_ngram", "dart"]


@dataclass
class MethodResult:
    """Per prompt: seconds, new tokens, and for DART methods tau and the time split. checked: the method's greedy
    outputs are held to vanilla's (the peers and DART)."""

    checked: bool = False
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)
    split: dict[str, float] = field(
        default_factory=lambda: {"draft": 0.0, "tree": 0.0, "verify": 0.0, "lookup": 0.0, "plain": 0.0, "other": 0.0}
    )
    mismatches: int = 0
    verify_steps: int = 0
    plain_steps: int = 0
    lookup_steps: int = 0
    budgets: list[int] = field(default_factory=list)
    tree_kinds: list[str] = field(default_factory=list)  # per drafted tree: "drawn" chain or deterministic "tree"
    alpha_hits: torch.Tensor | None = None  # [draft_length], the draft's teacher-forced agreement with vanilla
    alpha_rows: torch.Tensor | None = None

    def add_stats(self, stats, seconds: float) -> None:
        """Add one DART call's `DartStats`, the call having taken `seconds` in all."""
        if stats.verify_steps:
            self.taus.append(stats.tau)
        parts = {"draft": stats.draft_time, "tree": stats.tree_time, "verify": stats.verify_time,
                 "lookup": stats.lookup_time, "plain": stats.plain_time}
        for part, part_seconds in parts.items():
            self.split[part] += part_seconds
        self.split["other"] += seconds - sum(parts.values())
        self.verify_steps += stats.verify_steps
        self.plain_steps += stats.plain_steps
        self.lookup_steps += stats.lookup_steps
        self.budgets += stats.budgets
        self.tree_kinds += stats.tree_kinds

    def add_alpha(self, hits: torch.Tensor, rows: torch.Tensor) -> None:
        """Add one prompt's per-depth hits and supervised rows."""
        self.alpha_hits = hits.clone() if self.alpha_hits is None else self.alpha_hits + hits
        self.alpha_rows = rows.clone() if self.alpha_rows is None else self.alpha_rows + rows


def chat_inputs(tokenizer, prompt: str) -> dict:
    """`generate` inputs (`input_ids` `[1, S]`, `attention_mask`) for one user turn in the tokenizer's chat format."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )


def run_benchmark(
    target,
    tokenizer,
    draft: DartDraftModel | None,
    sets: list[str],
    prompts_per_set: int,
    max_new_tokens: int,
    do_sample: bool = False,
    methods: list[str] | None = None,
    tree_options: dict | None = None,
    assistant=None,
    arms: dict[str, tuple[DartDraftModel, dict]] | None = None,
    sitting_path: Path | None = None,
    max_minutes: float | None = None,
) -> dict:
    """Run every method on every prompt, interleaved (and the sets in turn); returns a JSON-ready dict of per-set
    results. `target`'s dtype is the run's: "vanilla", the peers and the DART methods use it; "vanilla_bf16" /
    "vanilla_float32" load a copy in that dtype. "assisted" is Transformers' assisted decoding with `assistant` (a
    smaller model with the target's tokenizer); "prompt_lookup" is its prompt lookup decoding (10 tokens). arms:
    more DART methods, by name, each with its own draft (bound to `target`) and `tree_options` on top of
    `tree_options`: two checkpoints, or two option sets (`benchmarks/ab_drafts.py`, `ab_options.py`); an arm's
    draft object keeps its own controller state, so give each arm its own.

    In sittings: with `sitting_path`, the run's state (per-prompt results, near-tie evidence, each DART method's
    controller evidence) is saved there after every prompt, and a run with the same settings resumes from it;
    `max_minutes` ends a sitting at the first prompt boundary past that time (a sitting runs one prompt at least).
    The summary says how many of the prompts it covers (`prompts_done` of `prompts_planned`) and over how many
    sittings."""
    methods = methods or list(DEFAULT_METHODS if target.dtype == torch.float32 else LOW_PRECISION_METHODS)
    if "vanilla" not in methods:
        methods = ["vanilla"] + methods  # the reference for every speedup and the greedy check
    if draft is None:
        methods = [m for m in methods if not m.startswith("dart")]
    arms = dict(arms or {})
    clashing = set(arms) & set(METHODS)
    if clashing:
        raise ValueError(f"Arm names {sorted(clashing)} are method names: name the arms otherwise.")
    methods = methods + list(arms)
    draft_of = {m: draft for m in methods if m.startswith("dart") and m not in arms}  # the DART methods' drafts
    draft_of.update({name: arm_draft for name, (arm_draft, _) in arms.items()})
    if "assisted" in methods and assistant is None:
        raise ValueError("The 'assisted' method needs an assistant model with the target's tokenizer: pass "
                         "assistant= (dart-hf bench --assistant NAME).")
    # the sets take turns, prompt by prompt: drift in the machine, the controller's evidence, or a sitting that
    # ends early spread over every set alike
    prompts = {name: load_prompts(name, prompts_per_set) for name in sets}
    work = [(name, prompts[name][i]) for i in range(prompts_per_set) for name in sets if i < len(prompts[name])]
    # a saved sitting that cannot be resumed here is refused before the copies load and the warm-up runs
    settings = sitting_settings(target, draft, assistant, methods, work, max_new_tokens, do_sample, tree_options)
    sitting = load_sitting(sitting_path, settings)
    other_dtypes = {"vanilla_bf16": torch.bfloat16, "vanilla_float32": torch.float32}
    copies = {
        method: type(target).from_pretrained(target.name_or_path, dtype=other_dtypes[method]).to(target.device).eval()
        for method in methods if method in other_dtypes
    }

    def method_call(method: str) -> tuple:
        """(model, generate kwargs) of a method."""
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, pad_token_id=tokenizer.pad_token_id)
        model = copies.get(method, target)
        kwargs.update(decoding_kwargs(method, assistant, draft_of.get(method)))
        if method in draft_of:
            kwargs["dart_chain"] = method == "dart_chain"  # Transformers' assisted decoding, DART's chain candidates
            kwargs["tree_options"] = {**(tree_options or {}), **dart_method_options(method),
                                      **(arms[method][1] if method in arms else {})}
        return model, kwargs

    # each DART method keeps its own controller evidence (the built-in ones share one draft object)
    dart_methods = list(draft_of)
    evidence = dict.fromkeys(dart_methods)  # None: fresh evidence
    checked_methods = [m for m in methods if m in PEER_METHODS] + dart_methods  # held to vanilla's greedy output

    def generate(method: str, inputs: dict, **overrides) -> torch.Tensor:
        model, kwargs = method_call(method)
        if method in evidence:
            evidence[method] = draft_of[method].controller_state.swap_evidence(evidence[method])
        try:
            return model.generate(**inputs, **{**kwargs, **overrides})
        finally:
            if method in evidence:
                evidence[method] = draft_of[method].controller_state.swap_evidence(evidence[method])

    # untimed warm-up of every method: first-call setup (and DART's one-time cost calibration) stays out of timings;
    # the evidence it leaves is dropped, since its text is not the benchmark's (its easy replies made the first
    # set's first calls try 33-61-node trees)
    for method in methods:
        generate(method, chat_inputs(tokenizer, WARM_UP_PROMPT).to(target.device), max_new_tokens=16)
    evidence = dict.fromkeys(dart_methods)

    clock = device_clock(target.device)
    results, near_ties = sitting["results"], sitting["near_ties"]
    if sitting["evidence"] is not None:
        evidence = sitting["evidence"]
    sitting["sittings"] += 1
    deadline = clock() + 60 * max_minutes if max_minutes else None
    for index in tqdm(range(sitting["done"], len(work)), desc="benchmark", unit="prompt", initial=sitting["done"],
                      total=len(work)):
        set_name, prompt = work[index]
        per_method = results.setdefault(set_name, {m: MethodResult(checked=m in checked_methods) for m in methods})
        inputs = chat_inputs(tokenizer, prompt).to(target.device)
        outputs = {}
        # every other prompt runs the methods in reverse order, so that running first or last (a warm or cold
        # cache, the machine's drift) favours no method
        for method in methods if index % 2 == 0 else methods[::-1]:
            if do_sample:
                torch.manual_seed(0)
            # vanilla keeps its logits for the near-tie judgement (generate copies them to float32 at every step
            # anyway: keeping them costs no time)
            keep_logits = {"output_logits": True, "return_dict_in_generate": True} if method == "vanilla" else {}
            start = clock()
            output = generate(method, inputs, **keep_logits)
            seconds = clock() - start
            if keep_logits and not do_sample:
                vanilla_logits = torch.cat(output.logits)
            outputs[method] = output = output.sequences if keep_logits else output
            result = per_method[method]
            result.seconds.append(seconds)
            result.tokens.append(output.shape[1] - inputs["input_ids"].shape[1])
            if method in draft_of:
                result.add_stats(draft_of[method].stats, seconds)
        if not do_sample:  # greedy: every checked method against vanilla, and each draft's agreement
            reference = outputs["vanilla"]
            for method in checked_methods:
                if not torch.equal(outputs[method], reference):
                    per_method[method].mismatches += 1
            prompt_length = inputs["input_ids"].shape[1]
            near_ties.setdefault(set_name, NearTieReport()).add_prompt(
                target, inputs["input_ids"][0], reference[0, prompt_length:], vanilla_logits,
                {method: outputs[method][0, prompt_length:] for method in checked_methods},
            )
            agreement = {}  # untimed: each draft's agreement with vanilla's greedy output, once per draft object
            for method in dart_methods:
                method_draft = draft_of[method]
                if id(method_draft) not in agreement:
                    agreement[id(method_draft)] = greedy_agreement(method_draft, target, reference, prompt_length)
                per_method[method].add_alpha(*agreement[id(method_draft)])
        sitting.update(done=index + 1, evidence=evidence)
        if sitting_path is not None:
            write_atomically(sitting_path, lambda tmp: torch.save(sitting, tmp))
        if deadline is not None and clock() > deadline:
            break
    summary = summarise(results, sampled=do_sample, near_ties=near_ties)
    summary["prompts_done"], summary["prompts_planned"] = sitting["done"], len(work)
    summary["sittings"] = sitting["sittings"]
    summary["weights_beside_target"] = {
        method: weights_beside_target(method, draft_of.get(method), assistant, copies.get(method)) for method in methods
    }
    dtype_name = str(target.dtype).removeprefix("torch.")
    summary["machine"] = {"device": device_description(target.device), "dtype": dtype_name}
    return summary


def sitting_settings(target, draft, assistant, methods, work, max_new_tokens, do_sample, tree_options) -> dict:
    """What a saved sitting must share with the run that resumes it: models, methods, prompts, decoding, and the
    machine (timings from two processors in one summary would report neither)."""
    return {
        "target": target.name_or_path, "dtype": str(target.dtype), "device": device_description(target.device),
        "methods": methods,
        "draft": draft.name_or_path if draft is not None else None,
        "assistant": assistant.name_or_path if assistant is not None else None,
        "prompts": work, "max_new_tokens": max_new_tokens, "do_sample": do_sample, "tree_options": tree_options,
    }


def load_sitting(path: Path | None, settings: dict) -> dict:
    """The saved state of an unfinished run with these `settings` at `path`, or a fresh one. Raises ValueError where
    `path` holds a run with other settings."""
    if path is None or not Path(path).exists():
        return {"settings": settings, "done": 0, "sittings": 0, "results": {}, "near_ties": {}, "evidence": None}
    sitting = torch.load(path, weights_only=False)  # written by this harness: dataclasses, not only tensors
    saved = sitting["settings"]
    if saved.get("device") != settings["device"]:
        machine = saved.get("device") or "an unrecorded machine"
        raise ValueError(f"{path} holds an unfinished benchmark timed on {machine}, not on this one "
                         f"({settings['device']}): finish it on that machine, or delete the file (or pick another "
                         "--out) to start anew here.")
    differing = [key for key in settings if saved.get(key) != settings[key]]
    if differing:
        raise ValueError(f"{path} holds an unfinished benchmark with other {', '.join(differing)}: rerun with that "
                         "run's settings to finish it, or delete the file (or pick another --out) to start anew.")
    return sitting


def decoding_kwargs(method: str, assistant=None, draft: DartDraftModel | None = None) -> dict:
    """The `generate` kwargs that choose a method's decoding: prompt lookup (10 tokens), assisted decoding with
    `assistant`, a DART method with its `draft`; none for vanilla."""
    if method == "prompt_lookup":
        return {"prompt_lookup_num_tokens": 10}
    if method == "assisted":
        return {"assistant_model": assistant}
    return {"assistant_model": draft} if draft is not None else {}


def dart_method_options(method: str) -> dict:
    """The `tree_options` a built-in DART method sets."""
    return {
        "dart_no_ngram": {"use_ngram": False},
        "dart_no_lookup": {"lookup_length": 0},  # the drafted trees alone, without context-lookup chains
        "dart_fixed_drafts": {"sample_drafts": 0},  # sampling with DART's deterministic trees, not drawn chains
        "dart_drawn_only": {"compare_policies": False},  # sampling with drawn chains alone, the tree not weighed
    }.get(method, {})


def weights_beside_target(method: str, draft, assistant, copy) -> int:
    """Bytes a method holds in memory besides the target's weights: the draft's weights and N-gram table (a DART
    method, whose `draft` that is; None for the others), the assistant's weights (assisted decoding), a copy of the
    target in another dtype, or nothing."""
    def parameter_bytes(model) -> int:
        return sum(p.numel() * p.element_size() for p in model.parameters()) if model is not None else 0

    if draft is not None:
        table = draft.ngram
        return parameter_bytes(draft) + (int(table.keys.nbytes + table.counts.nbytes) if table is not None else 0)
    if method == "assisted":
        return parameter_bytes(assistant)
    return parameter_bytes(copy)


def summarise(
    results: dict[str, dict[str, MethodResult]], sampled: bool = False,
    near_ties: dict[str, NearTieReport] | None = None,
) -> dict:
    """Per set and overall: prompts, tokens/s, speedups over vanilla in seconds per new token (median of per-prompt
    ratios, total) and over vanilla float32 where the run has it (`speedup_over_float32_total`), per set the calls
    over SLOW_CALL_FACTOR times the method's median seconds per new token there (`slow_calls`: other work on the
    machine), and for DART methods tau, time split, greedy mismatches (None for a `sampled` run, which has no
    greedy output to compare), the near-tie judgement of those mismatches (`near_ties`, from the per-set
    `near_ties` reports, all judged by the whole run's rounding scale), plain-decoding share and chosen budget, and
    for a sampled run the share of the drafted trees that were drawn chains (`drawn_fraction`; the rest
    deterministic)."""
    summary = {}
    near_ties = near_ties or {}
    whole_run = NearTieReport.merged(list(near_ties.values()))
    for set_name, per_method in list(results.items()) + [("overall", _merge(results))]:
        vanilla = per_method.get("vanilla")
        float32 = per_method.get("vanilla_float32")
        report = whole_run if set_name == "overall" else near_ties.get(set_name)
        rows = {}
        for method, result in per_method.items():
            row = {
                "prompts": len(result.seconds),
                "tokens_per_second": sum(result.tokens) / max(sum(result.seconds), 1e-9),
            }
            if set_name != "overall" and result.seconds:  # (sets differ in seconds per token: prefill lengths)
                per_token = [s / max(t, 1) for s, t in zip(result.seconds, result.tokens)]
                row["slow_calls"] = sum(p > SLOW_CALL_FACTOR * statistics.median(per_token) for p in per_token)
            if vanilla is not None:
                ratios = [float(speedup([v], [s], [vt], [t]))
                          for v, s, vt, t in zip(vanilla.seconds, result.seconds, vanilla.tokens, result.tokens)]
                row["speedup_median"] = statistics.median(ratios)
                row["speedup_total"] = float(speedup(vanilla.seconds, result.seconds, vanilla.tokens, result.tokens))
                row["speedup_total_ci95"] = bootstrap_interval(
                    vanilla.seconds, result.seconds, vanilla.tokens, result.tokens
                )
                row["seconds"] = result.seconds
                row["tokens"] = result.tokens
            if float32 is not None:
                row["speedup_over_float32_total"] = float(
                    speedup(float32.seconds, result.seconds, float32.tokens, result.tokens))
                row["speedup_over_float32_ci95"] = bootstrap_interval(
                    float32.seconds, result.seconds, float32.tokens, result.tokens)
            if result.checked:  # held to vanilla's greedy output
                row["greedy_mismatches"] = None if sampled else result.mismatches
                if report is not None and method in report.gaps:
                    row["near_ties"] = report.summary(method, rounding_scale=whole_run.rounding_scale)
            if result.verify_steps or result.plain_steps:
                row["tau"] = statistics.fmean(result.taus) if result.taus else 1.0
                total = sum(result.split.values())
                row["time_split"] = {part: value / total for part, value in result.split.items()} if total else {}
                row["plain_fraction"] = result.plain_steps / (result.plain_steps + result.verify_steps)
                row["lookup_fraction"] = result.lookup_steps / (result.plain_steps + result.verify_steps)
                row["budget_chosen"] = statistics.median(result.budgets) if result.budgets else 0
                if sampled and result.tree_kinds:  # which policy the drafted steps used
                    row["drawn_fraction"] = result.tree_kinds.count("drawn") / len(result.tree_kinds)
            if result.alpha_hits is not None:
                row["draft_alpha"] = (result.alpha_hits / result.alpha_rows.clamp(min=1)).tolist()
            rows[method] = row
        summary[set_name] = rows
    return summary


def speedup(
    base_seconds, method_seconds, base_tokens: list[int] | None = None, method_tokens: list[int] | None = None
) -> float:
    """Total seconds per new token of the base over the method's, summed over prompts (`[P]` each, or `[R, P]`
    for R resamples at once: then `[R]`); without token counts, the ratio of total seconds."""
    base = np.sum(base_seconds, axis=-1)
    method = np.maximum(np.sum(method_seconds, axis=-1), 1e-9)
    if base_tokens is not None:
        base = base / np.maximum(np.sum(base_tokens, axis=-1), 1)
        method = method / np.maximum(np.sum(method_tokens, axis=-1), 1)
    return base / method


def bootstrap_interval(
    numerators: list[float],
    denominators: list[float],
    numerator_tokens: list[int] | None = None,
    denominator_tokens: list[int] | None = None,
    resamples: int = 2000,
    seed: int = 0,
) -> list[float]:
    """95% bootstrap interval of `speedup(numerators, denominators, ...)` (the vanilla and the method seconds per
    prompt, with their new tokens), resampling the prompts with replacement: how far a set's total-time speedup
    could move on other prompts of the same kind."""
    picks = np.random.default_rng(seed).integers(0, len(numerators), size=(resamples, len(numerators)))
    tokens = () if numerator_tokens is None else (np.asarray(numerator_tokens)[picks],
                                                  np.asarray(denominator_tokens)[picks])
    ratios = speedup(np.asarray(numerators, dtype=float)[picks], np.asarray(denominators, dtype=float)[picks], *tokens)
    return np.percentile(ratios, [2.5, 97.5]).tolist()


def _merge(results: dict[str, dict[str, MethodResult]]) -> dict[str, MethodResult]:
    merged: dict[str, MethodResult] = {}
    for per_method in results.values():
        for method, result in per_method.items():
            target = merged.setdefault(method, MethodResult(checked=result.checked))
            target.seconds += result.seconds
            target.tokens += result.tokens
            target.taus += result.taus
            target.mismatches += result.mismatches
            target.verify_steps += result.verify_steps
            target.plain_steps += result.plain_steps
            target.lookup_steps += result.lookup_steps
            target.budgets += result.budgets
            target.tree_kinds += result.tree_kinds
            if result.alpha_hits is not None:
                target.add_alpha(result.alpha_hits, result.alpha_rows)
            for part, value in result.split.items():
                target.split[part] += value
    return merged


def result_sets(summary: dict) -> dict[str, dict]:
    """The per-set (and overall) rows of a summary, without its run-wide entries (machine, extra weights, progress)."""
    return {name: rows for name, rows in summary.items() if name not in RUN_ENTRIES}


def markdown_table(summary: dict) -> str:
    """The summary as a markdown table: total-time speedup per set and method with its 95% bootstrap interval over
    the prompts (and over vanilla float32 where the run has it), for DART tau and the shares of plain-decoding and
    context-lookup steps; then the draft's alpha, the near-tie judgement of a low-precision run and the machine."""
    machine, extra = summary.get("machine"), summary.get("weights_beside_target")
    progress = {key: summary.get(key, 1) for key in ("prompts_done", "prompts_planned", "sittings")}
    summary = result_sets(summary)
    methods = list(next(iter(summary.values())))
    header = "| set | " + " | ".join(f"{m} speedup (tau)" for m in methods) + " |"
    lines = [header, "|" + " --- |" * (len(methods) + 1)]
    for set_name, rows in summary.items():
        cells = []
        for method in methods:
            row = rows[method]
            cell = f"{row.get('speedup_total', 1.0):.2f}x"
            if method != "vanilla" and "speedup_total_ci95" in row:
                cell += " [{:.2f}-{:.2f}]".format(*row["speedup_total_ci95"])
            if method != "vanilla_float32" and "speedup_over_float32_total" in row:
                cell += f", {row['speedup_over_float32_total']:.2f}x over float32"
            if "tau" in row:
                shares = [f"{row[key]:.0%} {name}" for key, name in (("plain_fraction", "plain"),
                          ("lookup_fraction", "lookup"), ("drawn_fraction", "drawn")) if row.get(key)]
                tau = f"{row['tau']:.2f}"
                cell += f" ({', '.join([tau] + shares)})"
            cells.append(cell)
        lines.append(f"| {set_name} | " + " | ".join(cells) + " |")
    alphas = {name: next((row["draft_alpha"] for row in rows.values() if "draft_alpha" in row), None)
              for name, rows in summary.items()}
    if any(alpha is not None for alpha in alphas.values()):
        depths = len(next(alpha for alpha in alphas.values() if alpha is not None))
        lines += ["", "Draft agreement with vanilla's greedy output (teacher-forced top-1, per drafted position):", ""]
        lines.append("| set | " + " | ".join(f"alpha_{d + 1}" for d in range(depths)) + " |")
        lines.append("|" + " --- |" * (depths + 1))
        for set_name, alpha in alphas.items():
            if alpha is not None:
                lines.append(f"| {set_name} | " + " | ".join(f"{a:.1%}" for a in alpha) + " |")
    judged = {method: row["near_ties"] for method, row in summary.get("overall", {}).items() if "near_ties" in row}
    if judged:
        lines += ["", "Greedy outputs against vanilla's in the same dtype (`dart_hf.near_ties`):", ""]
        lines += [f"- {method}: {describe(judgement)}" for method, judgement in judged.items()]
    slow = [f"{set_name} {method} {row['slow_calls']}" for set_name, rows in summary.items()
            for method, row in rows.items() if row.get("slow_calls")]
    if slow:
        lines += ["", f"Calls over {SLOW_CALL_FACTOR:g}x their method's median seconds per new token on the set (other "
                  f"work on the machine? rerun those sets): {', '.join(slow)}."]
    weights = {method: size for method, size in (extra or {}).items() if size}
    if weights:
        lines += ["", "Weights held beside the target's: " + ", ".join(
            f"{method} {size / 2**20:,.1f} MiB" for method, size in weights.items()) + "."]
    if machine:
        lines += ["", f"Machine: {machine['device']}; the target in {machine['dtype']}."]
    if progress["prompts_done"] < progress["prompts_planned"]:
        lines += ["", f"Unfinished: {progress['prompts_done']} of {progress['prompts_planned']} prompts, in "
                  f"{progress['sittings']} sitting(s); rerun the same command to go on."]
    elif progress["sittings"] > 1:
        lines += ["", f"Run in {progress['sittings']} sittings (each with its own untimed warm-up)."]
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    """Bar charts of the speedup and tau per set and method, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result_sets(summary)
    sets = list(summary)
    methods = list(summary[sets[0]])
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(methods)
    for index, method in enumerate(methods):
        positions = [i + index * width for i in range(len(sets))]
        left.bar(positions, [summary[s][method].get("speedup_total", 1.0) for s in sets], width, label=method)
        if "tau" in summary[sets[0]][method]:
            right.bar(positions, [summary[s][method]["tau"] for s in sets], width, label=method)
    titles = ((left, "speedup over vanilla in the same dtype (total time)"), (right, "tau (tokens per verify step)"))
    for axis, title in titles:
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(sets))], sets, rotation=30)
        axis.set_title(title)
        axis.legend(fontsize=7)
    left.axhline(1.0, color="black", linewidth=0.5)
    figure.tight_layout()
    write_atomically(Path(path), lambda tmp: figure.savefig(tmp, dpi=120, format="png"))
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    """`dart-hf bench`: run the benchmark and write JSON, markdown and PNG next to `--out`."""
    parser = argparse.ArgumentParser(prog="dart-hf bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--draft", default=None, help="shipped draft name, folder or Hub repo (none: baselines only)")
    parser.add_argument("--assistant", default=None,
                        help="the 'assisted' method's assistant: a zoo name or folder with the target's tokenizer "
                        f"(default for a zoo target: {ASSISTANTS})")
    parser.add_argument("--sets", nargs="+", default=BENCHMARK_SETS)
    parser.add_argument("--prompts-per-set", type=positive_int, default=20)
    parser.add_argument("--max-new-tokens", type=positive_int, default=32,
                        help="default 32: the default run fits 30 min")
    parser.add_argument("--sample", action="store_true", help="T=1 sampling instead of greedy")
    parser.add_argument("--quick", action="store_true", help="2 prompts per set, 32 new tokens")
    parser.add_argument("--tree-budget", type=positive_int, default=None,
                        help="tree nodes (default: the draft's config)")
    parser.add_argument("--methods", nargs="+", default=None, choices=METHODS,
                        help=f"default: {DEFAULT_METHODS} in float32, else {LOW_PRECISION_METHODS}")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "auto"], default="float32",
                        help="the target's dtype for vanilla and DART (auto: the fastest this hardware has, as "
                        "`zoo.load_target` picks it); a low-precision run also times vanilla float32")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bench"))
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="end this sitting at the first prompt past this time; rerunning the same command goes on "
                        "from OUT.sitting.pt")
    short_usage(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts_per_set, args.max_new_tokens = 2, 32
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sitting_path = Path(f"{args.out}.sitting.pt")  # the unfinished run's state, removed once it completes
    target, tokenizer = load_target(args.target, dtype=None if args.dtype == "auto" else getattr(torch, args.dtype))
    draft = load_draft(args.draft, target) if args.draft else None
    assistant = None
    if args.methods and "assisted" in args.methods:
        name = args.assistant or ASSISTANTS.get(args.target.lower())
        if name is None:
            raise ValueError(f"--methods assisted needs --assistant (a smaller model with {args.target}'s tokenizer).")
        assistant = load_target(name, dtype=target.dtype, device=target.device)[0]
    summary = run_benchmark(
        target, tokenizer, draft, args.sets, args.prompts_per_set, args.max_new_tokens, do_sample=args.sample,
        methods=args.methods, tree_options={"budget": args.tree_budget} if args.tree_budget else None,
        assistant=assistant, sitting_path=sitting_path, max_minutes=args.max_minutes,
    )
    for suffix, text in ((".json", json.dumps(summary, indent=2) + "\n"), (".md", markdown_table(summary) + "\n")):
        write_atomically(Path(f"{args.out}{suffix}"), lambda tmp: Path(tmp).write_text(text))
    plot(summary, Path(f"{args.out}.png"))
    print(markdown_table(summary))
    if summary["prompts_done"] == summary["prompts_planned"]:
        sitting_path.unlink(missing_ok=True)
    else:
        print(f"\nThis sitting ended at --max-minutes: rerun the same command to go on from {sitting_path}.")


if __name__ == "__main__":
    main()
