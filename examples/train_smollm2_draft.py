"""Recipe for the SmolLM2-135M-Instruct draft: data (resumable), training, then shipping. Every step can be
rerun: the self-distilled file is appended to, and training can warm-start from the shipped draft.

    python examples/train_smollm2_draft.py --distill-minutes 30 --benchlike-minutes 40 --max-steps 300 \
        --eval-steps 75 --init-draft smollm2-135m-instruct-dart --output drafts/smollm2-next
    python benchmarks/ab_drafts.py smollm2-135m-instruct-dart drafts/smollm2-next   # faster than the shipped one?
    python examples/train_smollm2_draft.py --export drafts/smollm2-next/checkpoint-300   # into the package
    dart-hf bench --draft smollm2-135m-instruct-dart --out benchmarks/results/smollm2
    dart-hf bench --draft smollm2-135m-instruct-dart --sample --methods vanilla dart_drawn_only dart \
        --out benchmarks/results/smollm2_sample
    python examples/train_smollm2_draft.py --card benchmarks/results/smollm2.json \
        --card-sampled benchmarks/results/smollm2_sample.json   # model_cards/...md
"""

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from dart_hf.files import extend_lines, write_atomically
from dart_hf.prompts import load_prompts, read_set_file, reference_conversations, training_prompts
from dart_hf.training.recipe import ship_recipe_draft

DATA = Path("data/smollm2")
# prompts shaped like the benchmark sets (code to complete or write, maths problems, news to summarise, open-ended
# questions and writing tasks), a seeded sample of each kind, none of them a benchmark prompt: round 3's, then
# round 4's and 5's (the next prompts of each kind's shuffle, appended so that earlier ids stay valid)
BENCHLIKE_SAMPLES = [
    {"python-complete": 320, "python-write": 240, "math-train": 320, "xsum": 200},
    {"python-complete": 240, "python-write": 160, "math-train": 240},
    {"python-complete": 94, "python-write": 160, "math-train": 240},  # round 4's second sitting: every function
    {"open-ended": 1193, "xsum": 120},  # round 5: every open-ended prompt (the kind MT-Bench and AlpacaEval ask)
    {"math-train": 480, "xsum": 240},  # round 6: news for CNN/DailyMail, the weakest set, and more MATH problems
    {"xsum": 440, "math-train": 480},  # round 7: every remaining XSum article (news pays most per reply) and MATH
    {"math-train": 960},  # round 8: more MATH problems (about 1,800 remain)
]
# `--sampled-minutes`: replies sampled at this temperature to the benchmark-like prompts of these kinds (the ones
# whose greedy replies are in training), new text for the weakest sets once their kinds' prompts are all used
SAMPLED_KINDS = ("open-ended", "xsum")
SAMPLED_TEMPERATURE = 0.7
# `--with-references`: the sets that ship an answer to each prompt (MATH's worked solutions, the standard library
# functions' own source), used as they are with the target's distributions on them as labels (no generation)
REFERENCE_SETS = ["math-train", "python-stdlib"]
DRAFT_NAME = "smollm2-135m-instruct-dart"
MAX_LENGTH = 1024  # training sequences are cut here
RESULTS = """Measured with `dart-hf bench --draft smollm2-135m-instruct-dart --prompts-per-set 20 --methods
vanilla prompt_lookup dart_no_lookup dart` on a 2-core x86 CPU: greedy, float32, 20 prompts per set, 32 new
tokens, every method interleaved prompt by prompt after an untimed warm-up (21 minutes; vanilla ran at 15.0
tokens/s). Speedup is the total-time ratio over vanilla float32 `generate`, with its 95% bootstrap interval over
the prompts; tau is tokens committed per verification (a drafted tree or a context-lookup chain); "plain" and
"lookup" are the shares of steps that decoded without drafting and that verified a chain copied from earlier in
the text. `dart_no_lookup` is the drafted trees alone. All 280 DART outputs were identical to vanilla's. The
adaptive budget chose 2-node trees on four sets and 4-node ones on three: on that CPU's calibration, with the
tree forward's products taken weight first where that measured faster (dart-hf's `weight_major`), a 2-node
forward cost 0.86x a one-token one and a 4-node one 0.98x (1.58x and 1.64x the usual way). The prompt's prefill,
the same work for both, is about a fifth of vanilla's time at 32 new tokens.

"""
SAMPLED_RESULTS = """

Sampling at T=1 (`dart-hf bench --draft smollm2-135m-instruct-dart --sample --prompts-per-set 20 --methods
vanilla dart_drawn_only dart`, the same seed before every method, speedups in seconds per new token, 12 minutes;
vanilla ran at 15.0 tokens/s): `dart_drawn_only` drafts chains of tokens drawn from the draft
(`tree_sample_drafts` 0.7); `dart`, what this draft runs when sampling, also weighs DART's deterministic tree
each step (`tree_compare_policies`) where a 17-node tree costs at most two one-token forwards; on that CPU's
calibration it cost 2.11, so both columns drafted drawn chains alone and differ by the run's noise.

"""
TRAINING = """Data (`data/smollm2/`): {data}

Recipe (`examples/train_smollm2_draft.py`, every step resumable; on this project's 2-core CPU): one decoder
layer, 16,384-token draft vocabulary (the most frequent reply tokens of the first round), prefix-shared masked
training with 24 anchors per sequence, loss `sum_k 0.6^k KL(p_target || q_draft)` on reply tokens (soft
labels), AdamW with a cosine schedule, batch 8, feature dropout 0.1. Nine shipped rounds, each warm-started from
the one before (round 9's run was not shipped; its data is in round 10's):

1. 160 steps from scratch and 2. 600 steps (three sittings with `resume_from_checkpoint`): the general
   self-distilled replies mixed 1:1 with the Alpaca demo replies (teacher-labelled), learning rate 5e-4,
   sequences up to 320 tokens; about 2.5 CPU-hours.
3. 300 steps (48 minutes): the general replies plus the benchmark-like replies three times over (about half of
   what training sees), the Alpaca demo replies at 0.15 per self-distilled one, learning rate 3e-4, sequences
   up to 1,024 tokens grouped by length (the 24 news articles too long to leave 32 reply tokens are left out).
4. 180 steps (25 minutes): the same mix with round 4's 1,134 further benchmark-like replies (2,079 benchmark-like
   replies in the training split), in a new order (seed 1).
5. 220 steps (29 minutes): the same mix with round 5's 1,313 replies to open-ended prompts and news articles
   (3,298 benchmark-like replies in the training split).
6. 220 steps (40 minutes, longer sequences): the same mix with round 6's 696 replies to MATH problems and news
   articles (3,952 benchmark-like replies in the training split).
7. 480 steps (42 minutes plus two held-out evaluations): the same mix with round 7's 944 replies to news
   articles and MATH problems (4,771 benchmark-like replies in the training split), the frozen target in
   bfloat16 (`target_dtype`: 1.8x the steps per CPU-minute here; the draft still trains in float32).
8. 480 steps (42 minutes with two held-out evaluations): the same mix with round 8's 960 replies to MATH
   problems and 744 further general replies (5,683 benchmark-like replies in the training split), logits
   computed only for the supervised rows (0.77x the step time).
10. 480 steps (40 minutes with two held-out evaluations): the same mix with round 9's 312 further general
   replies and round 10's 720 replies sampled at T=0.7 to open-ended prompts (`selfdistill_sampled.jsonl`,
   three times over like the benchmark-like replies). Interleaved A/B against round 8's draft (12 prompts per
   set, 84/84 outputs identical to vanilla's for each): alpha_1 43.7% -> 46.0% (MT-Bench 32.6% -> 38.3%, GSM8K
   48.7% -> 53.9%), 1.248x -> 1.266x overall.

Tried in round 4 and not shipped, each 100 steps warm-started from round 3's draft with the same learning-rate
schedule, scored by agreement with vanilla's greedy output on the benchmark texts (12 prompts per set, 64
tokens): round 3's data again in a new order, 33.2% alpha_1; the same plus reference replies (MATH's worked
solutions and the standard library functions' own source, teacher-labelled, drawn at 0.5 per self-distilled
reply; `--with-references`), 33.0%; round 3's draft itself 33.7%. The references' 100 steps took 20 minutes
against 9 (longer sequences; both runs shared the CPU with evaluations, so roughly) and lowered MATH-500's
alpha_1 (37.0% against 39.5% without them): human-written solutions are not how this model writes. Replies the
target wrote itself to new prompts of the benchmarks' kinds are what moved agreement: round 3, round 4 (33.7% ->
34.7% alpha_1, 11.6% -> 13.5% alpha_2 on the same texts), round 5 (36.3% -> 37.3% alpha_1 on the A/B's texts,
MT-Bench 27.3% -> 30.7%), round 6 (37.3% -> 39.1%, CNN/DailyMail 22.7% -> 26.0%, GSM8K 40.6% -> 44.0%), round 7
(39.1% -> 41.7%) and round 8 (41.7% -> 43.7%, MATH-500 49.2% -> 57.3%, MT-Bench 34.4% -> 32.6%); and once no new
prompts of a kind were left, the target's sampled replies to the same prompts: round 10 (43.7% -> 46.0%, MT-Bench
32.6% -> 38.3%).

Tried in round 5 and not shipped: the same 220 steps with the MLP widened from 1,536 to 4,608 units first
(`--widen-mlp 4608`; the widened draft starts from exactly round 4's logits): held-out alpha_1 49.16% against
49.17%, benchmark alpha_1 37.5% against 37.3%, and slower in the interleaved A/B (1.181x against 1.196x overall:
a wider draft costs more per step). Capacity of this size is not what limits the draft.

The N-gram table (order 3) counts the training splits of both self-distilled files plus the Alpaca demo
replies, prompts included. Shipped in bfloat16 (the draft only proposes tokens, so its precision never changes
the output).

    python examples/train_smollm2_draft.py --sampled-minutes 32 --max-steps 480 \\
        --eval-steps 240 --init-draft smollm2-135m-instruct-dart --output drafts/smollm2-next
    python benchmarks/ab_drafts.py smollm2-135m-instruct-dart drafts/smollm2-next
    python examples/train_smollm2_draft.py --export drafts/smollm2-next

Held-out agreement during round 10 (546 self-distilled examples: every 20th of the general replies, mostly
short chitchat, and of the benchmark-like ones; easier than the benchmark sets, whose own alpha table is in
Results; the held-out set grows with each round, so rounds are not comparable on it):

{history}
"""
LIMITATIONS = """- Trained on a 2-core CPU with 4,920 general self-distilled replies (mostly short chitchat
  and Alpaca-style instructions), 6,127 replies to benchmark-like and open-ended prompts and 720 sampled replies
  to open-ended prompts: its agreement with the target (alpha_1 46% on the benchmark texts, 31-42% on news
  summaries, code completion and MT-Bench) is far below the paper's drafts (about 75%). With the tree forward's
  products taken weight first on that CPU (dart-hf's `weight_major`), its drafted trees alone run at 1.28x plain
  decoding's speed overall (1.04x on CNN/DailyMail, where they decode plainly on 19% of the steps, 1.42-1.62x on
  MATH-500 and MBPP); context lookup, which the adaptive budget verifies instead of a tree when its measured
  acceptance pays, brings DART to 1.41x (HumanEval 2.00x), not the paper's 2-3x. At 32 new tokens the prompt's
  prefill is about a fifth of vanilla's time and the same work for both; at 128 new tokens (`dart-hf bench
  --max-new-tokens 128 --prompts-per-set 20 --methods vanilla prompt_lookup dart`) DART read 1.68x [1.62-1.75]
  overall (1.35-2.01x per set, tau 2.15), prompt lookup 0.91x.
- At T=1 a drawn chain accepts fewer tokens (tau 1.32-1.52 on chat and GSM8K); DART read 1.32x overall there,
  1.14x on CNN/DailyMail, every set's interval above 1.00x. The speedups are those of that CPU and its
  calibration, measured again on each machine.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distill-minutes", type=float, default=0, help="self-distil for this long first (resumable)")
    parser.add_argument("--benchlike-minutes", type=float, default=0,
                        help="self-distil the benchmark-like prompt sample for this long first (resumable)")
    parser.add_argument("--sampled-minutes", type=float, default=0,
                        help=f"self-distil replies sampled at T={SAMPLED_TEMPERATURE} to the open-ended and news "
                        "prompts for this long first (resumable)")
    parser.add_argument("--sampled-weight", type=int, default=3,
                        help="how many times over training sees the sampled replies (the benchmark-like ones: 3)")
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--eval-steps", type=int, default=250, help="evaluate and checkpoint this often")
    parser.add_argument("--init-draft", default=None, help="warm-start from this draft")
    parser.add_argument("--widen-mlp", type=int, default=None, metavar="UNITS",
                        help="widen the --init-draft's MLP to this many units first (`dart-hf train --widen_mlp`)")
    parser.add_argument("--with-references", action="store_true",
                        help="also train on the reference replies of REFERENCE_SETS (measured: no gain, see the card)")
    parser.add_argument("--output", default="drafts/smollm2-135m-instruct-dart")
    parser.add_argument("--ngram-only", action="store_true", help="only (re)build the N-gram table in --output")
    parser.add_argument("--export", type=Path, default=None, help="ship this checkpoint (bfloat16) in the package")
    parser.add_argument("--card", type=Path, default=None, help="write the model card from this `dart-hf bench` JSON")
    parser.add_argument("--card-sampled", type=Path, default=None,
                        help="with --card: a `dart-hf bench --sample` JSON whose `dart_drawn_only` the card shows too")
    args = parser.parse_args()
    if args.ngram_only:
        return build_ngram_table(Path(args.output))
    if args.export:
        return ship_recipe_draft(args.export, "smollm2-135m-instruct", DRAFT_NAME, build_ngram_table)
    if args.card:
        sampled = json.loads(args.card_sampled.read_text()) if args.card_sampled else None
        return write_model_card(json.loads(args.card.read_text()), sampled)
    DATA.mkdir(parents=True, exist_ok=True)
    if args.distill_minutes > 0:
        self_distill(["--prompt-set", "alpaca-demo", "--prompt-set", "chitchat", "--prompt-set", "openai-evals"],
                     DATA / "selfdistill.jsonl", args.distill_minutes)
    if args.benchlike_minutes > 0:
        self_distill([str(benchlike_prompt_file())], DATA / "selfdistill_benchlike.jsonl", args.benchlike_minutes)
    if args.sampled_minutes > 0:
        self_distill([str(sampled_prompt_file()), "--temperature", str(SAMPLED_TEMPERATURE)],
                     DATA / "selfdistill_sampled.jsonl", args.sampled_minutes)
    # the Alpaca demo replies, used as they are (teacher-labelled): Apache-2.0, inside the llamafactory sdist
    replies = DATA / "alpaca_demo_replies.json"
    replies.write_bytes(read_set_file("alpaca-demo"))
    for name, suffix in (("selfdistill.jsonl", ""), ("selfdistill_benchlike.jsonl", "_benchlike")):
        held_out, train = split_held_out(DATA / name, drop_long=bool(suffix))
        (DATA / f"heldout{suffix}.jsonl").write_text("\n".join(held_out) + "\n")
        (DATA / f"train{suffix}.jsonl").write_text("\n".join(train) + "\n")
    train_files = [str(DATA / "train.jsonl")] + [str(DATA / "train_benchlike.jsonl")] * 3
    sampled = DATA / "selfdistill_sampled.jsonl"
    if sampled.exists():  # no held-out part: its prompts are all in the training split of the greedy replies
        lines = [line for line in sampled.read_text().strip().split("\n") if fits(line)]
        (DATA / "train_sampled.jsonl").write_text("\n".join(lines) + "\n")
        train_files += [str(DATA / "train_sampled.jsonl")] * args.sampled_weight
    config = {
        # the benchmark-like replies three times over: about half of what training sees
        "target": "smollm2-135m-instruct",
        "train_files": train_files,
        "existing_files": [str(replies)], "existing_ratio": 0.15,
        "eval_files": [str(DATA / "heldout.jsonl"), str(DATA / "heldout_benchlike.jsonl")],
        "output_dir": args.output, "max_steps": args.max_steps, "per_device_train_batch_size": 8,
        "learning_rate": 3e-4, "lr_scheduler_type": "cosine", "warmup_steps": 20, "max_grad_norm": 0.5,
        "draft_vocab_size": 16384, "anchors_per_sequence": 24, "max_length": MAX_LENGTH, "feature_dropout": 0.1,
        "train_sampling_strategy": "group_by_length",
        "eval_strategy": "steps", "eval_steps": args.eval_steps, "save_steps": args.eval_steps, "save_total_limit": 4,
        "logging_steps": 10, "report_to": "none", "use_cpu": True,
        # the frozen teacher in bfloat16: 1.8x the steps per CPU-minute here (AVX512-BF16), agreement unchanged
        "target_dtype": "bfloat16",
        "early_stopping_patience": 3, "dataloader_num_workers": 0, "seed": 1,
    }
    if args.init_draft:
        config["init_draft"] = args.init_draft
    if args.widen_mlp:
        config["widen_mlp"] = args.widen_mlp
    if args.with_references:  # the round-4 experiment: reference replies drawn at 0.5 per self-distilled example
        config.update(existing_files=[str(reference_file()), str(replies)], existing_ratio=0.5)
    (DATA / "train_config.json").write_text(json.dumps(config, indent=2))
    start = time.time()
    subprocess.run([sys.executable, "-m", "dart_hf.cli", "train", str(DATA / "train_config.json")], check=True)
    print(f"trained in {(time.time() - start) / 60:.1f} min -> {args.output}")
    build_ngram_table(Path(args.output))


def fits(line: str) -> bool:
    """Whether a record leaves 32 reply tokens inside MAX_LENGTH (sequences are cut there: long news articles don't)."""
    return len(json.loads(line)["prompt_ids"]) + 32 <= MAX_LENGTH


def split_held_out(path: Path, drop_long: bool) -> tuple[list[str], list[str]]:
    """A self-distilled file's lines as (held out, train): every 20th line is held out, spread over prompt lengths
    (the file is in the order of prompt length); with `drop_long`, the lines that don't `fit` are left out first."""
    lines = path.read_text().strip().split("\n")
    if drop_long:
        lines = [line for line in lines if fits(line)]
    return [line for i, line in enumerate(lines) if i % 20 == 0], [line for i, line in enumerate(lines) if i % 20]


def sampled_prompt_file() -> Path:
    """`data/smollm2/sampled_prompts.jsonl` (the sampled file's ids index it): the benchmark-like prompts of
    SAMPLED_KINDS, in their file's order, less those whose greedy reply is held out (which must stay unseen)."""
    held_out, _ = split_held_out(DATA / "selfdistill_benchlike.jsonl", drop_long=True)
    held_out_ids = {json.loads(line)["id"] for line in held_out}
    prompts = benchlike_prompt_file().read_text().strip().split("\n")
    lines = [line for i, line in enumerate(prompts)
             if i not in held_out_ids and json.loads(line)["kind"] in SAMPLED_KINDS]
    path = DATA / "sampled_prompts.jsonl"
    write_atomically(path, lambda temporary: Path(temporary).write_text("\n".join(lines) + "\n"))
    return path


def self_distill(sources: list[str], output: Path, minutes: float) -> None:
    """`dart-hf self-distill` of `sources` (prompt files or `--prompt-set` options) into `output`, starting no
    batch after `minutes`; what finished is on disk, and a rerun goes on from there."""
    command = [sys.executable, "-m", "dart_hf.cli", "self-distill", "--target", "smollm2-135m-instruct", *sources,
               "--output", str(output), "--max-new-tokens", "128", "--batch-size", "24",
               "--max-minutes", str(minutes)]
    subprocess.run(command, check=True)


def benchlike_prompt_file() -> Path:
    """`data/smollm2/benchlike_prompts.jsonl` (the self-distilled file's ids index it): per sample of
    `BENCHLIKE_SAMPLES` and per kind, in that order, the next n prompts of the kind's `random.Random(0)` shuffle.
    The standard library's functions give the "complete" and "write" kinds (the halves of `python-stdlib`);
    MATH-500's problems are removed from `math-train` by the benchmark deduplication. Prompts already in the file
    stay where they are; later samples are appended."""
    path = DATA / "benchlike_prompts.jsonl"
    python = load_prompts("python-stdlib")
    pools = {"python-complete": python[: len(python) // 2], "python-write": python[len(python) // 2 :],
             "math-train": training_prompts(["math-train"]), "xsum": load_prompts("xsum"),
             "open-ended": training_prompts(["arena-hard", "ifeval"])}
    rng = random.Random(0)
    for pool in pools.values():  # one shuffle per kind, in the order they were added (a later kind moves no id)
        rng.shuffle(pool)
    taken, lines = dict.fromkeys(pools, 0), []
    for sample in BENCHLIKE_SAMPLES:
        for kind, count in sample.items():
            chosen = pools[kind][taken[kind] : taken[kind] + count]
            taken[kind] += count
            lines += [json.dumps({"kind": kind, "messages": [{"role": "user", "content": text}]}) for text in chosen]
    extend_lines(path, lines)
    return path


def reference_file() -> Path:
    """`data/smollm2/benchlike_references.jsonl`: the `{"prompt", "response"}` pairs of `REFERENCE_SETS`, less the
    prompts of the self-distilled benchmark-like sample (whose held-out part must stay unseen). Rebuilt from the
    packages each run (not committed)."""
    path = DATA / "benchlike_references.jsonl"
    sample = benchlike_prompt_file().read_text().split("\n")
    sampled = {json.loads(line)["messages"][0]["content"] for line in sample if line}
    lines = [json.dumps(record) for record in reference_conversations(REFERENCE_SETS, exclude=sampled)]
    write_atomically(path, lambda temporary: Path(temporary).write_text("\n".join(lines) + "\n"))
    return path


def build_ngram_table(output: Path) -> None:
    """The draft's N-gram table: the target's own replies (training split of the self-distilled file) plus the
    Alpaca demo replies (Apache-2.0), prompts included; saved as `ngram.safetensors` beside the draft."""
    from dart_hf import NgramTable
    from dart_hf.training import conversation_examples, load_conversations, load_examples
    from dart_hf.zoo import load_target

    target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)
    examples = load_examples([DATA / "train.jsonl", DATA / "train_benchlike.jsonl"])
    examples += conversation_examples(tokenizer, load_conversations(DATA / "alpaca_demo_replies.json"))
    table = NgramTable.from_sequences(
        (e["prompt_ids"] + e["response_ids"] for e in examples), vocab_size=target.config.vocab_size, order=3
    )
    table.metadata["source"] = "self-distilled train split + Alpaca demo replies"
    table.save(output / "ngram.safetensors")
    print(f"N-gram table: {table.describe()} -> {output / 'ngram.safetensors'}")


def write_model_card(summary: dict, sampled: dict | None = None) -> None:
    """`model_cards/smollm2-135m-instruct-dart.md` from a `dart-hf bench` summary (and the `dart_drawn_only` of a
    sampled one) and the recipe above."""
    from dart_hf.bench import markdown_table
    from dart_hf.model_card import alpha_history_table, draft_model_card
    from dart_hf.zoo import draft_path, load_draft, load_target

    target, _ = load_target("smollm2-135m-instruct", dtype=torch.float32)
    draft = load_draft(DRAFT_NAME, target)
    state_file = Path(draft_path(DRAFT_NAME)) / "trainer_state.json"
    training = TRAINING.format(data=(DATA / "README.md").read_text().split("\n", 1)[1].strip(),
                               history=alpha_history_table(json.loads(state_file.read_text())["log_history"]))
    results = RESULTS + markdown_table(summary)
    if sampled is not None:
        drawn = {name: {m: rows[m] for m in ("vanilla", "dart_drawn_only", "dart") if m in rows}
                 for name, rows in sampled.items()}
        results += SAMPLED_RESULTS + markdown_table(drawn).split("\n\nDraft agreement")[0]
    card = draft_model_card(
        draft, f"dart-hf/{DRAFT_NAME}", base_model="HuggingFaceTB/SmolLM2-135M-Instruct", results=results,
        training=training, license="apache-2.0", limitations=LIMITATIONS,
    )
    path = Path("model_cards") / f"{DRAFT_NAME}.md"
    write_atomically(path, card.save)
    print(f"model card -> {path}")


if __name__ == "__main__":
    main()
