"""Recipe for a first Gemma 3 270M draft (a base model: text continuation), bounded in CPU time: data
(resumable), training, N-gram table. Every step can be rerun: the self-distilled file is appended to.

    python examples/train_gemma3_draft.py --prompts 1400 --distill-minutes 45 --max-steps 240 --eval-steps 120 \
        --output drafts/gemma3-270m
    python benchmarks/bench_sliding_window.py --draft drafts/gemma3-270m/checkpoint-240   # against vanilla
    python examples/train_gemma3_draft.py --alphas drafts/gemma3-270m/checkpoint-240   # held-out alpha_1..8
    python examples/train_gemma3_draft.py --max-steps 480 --eval-steps 120 --resume drafts/gemma3-270m/checkpoint-240
    python examples/train_gemma3_draft.py --export drafts/gemma3-270m   # into the package: gemma3-270m-dart
    python benchmarks/bench_sliding_window.py --draft drafts/gemma3-270m/checkpoint-240 --untrained-too \
        --out benchmarks/results/gemma3_270m_draft_step240.json   # 960 new tokens, step 240's weights
    python benchmarks/bench_sliding_window.py --draft gemma3-270m-dart --untrained-too --prompts 20 \
        --new-tokens 128 --out benchmarks/results/gemma3_270m_draft_128.json
    python examples/train_gemma3_draft.py --card benchmarks/results/gemma3_270m_draft_128.json \
        benchmarks/results/gemma3_270m_draft_step240.json   # model_cards/gemma3-270m-dart.md

Prompts are the first PROMPT_TOKENS tokens (`<bos>` included) of texts of the kinds the Gemma benchmark continues
(`benchmarks/bench_sliding_window.py`: news, code, maths, open-ended questions), taken from the training prompt
sets only, mixed in KIND_MIX's proportions in a seeded order; the target continues each greedily for NEW_TOKENS
tokens in bfloat16 (2.1x the tokens per second of float32 on an AVX512-BF16 CPU; the float32 target still labels
every token with its own distributions during training).
"""

import json
import random
from pathlib import Path

import torch

from dart_hf.files import write_atomically
from dart_hf.prompts import load_prompts, training_prompts
from dart_hf.training.recipe import (
    build_ngram_table,
    held_out_alphas,
    interleaved_prompt_file,
    recipe_dtype,
    recipe_parser,
    self_distill_sitting,
    ship_recipe_draft,
    split_held_out,
    train_sitting,
)

DATA = Path("data/gemma3")
TARGET = "gemma3-270m"
DRAFT_NAME = "gemma3-270m-dart"
PROMPT_TOKENS = 96  # as the benchmark cuts its prompts
NEW_TOKENS = 256
MAX_LENGTH = PROMPT_TOKENS + NEW_TOKENS
# per 20 prompts: the benchmark's five sets are news (CNN/DailyMail), code (HumanEval), maths (GSM8K) and two of
# open-ended questions (MT-Bench, AlpacaEval)
KIND_MIX = {"news": 4, "code": 4, "math": 4, "open-ended": 8}


MIN_CHARS = 60  # shorter texts (a lone word or character, as some OpenAI evals prompts are) teach nothing


def prompt_pools() -> dict[str, list[str]]:
    """Each kind's texts of MIN_CHARS or more, from training sets only (none is a benchmark prompt), each in a
    `random.Random(0)` shuffle."""
    pools = {
        "news": load_prompts("xsum"),
        "code": load_prompts("python-stdlib"),
        "math": training_prompts(["math-train"]),
        "open-ended": training_prompts(["arena-hard", "ifeval", "alpaca-demo", "openai-evals"]),
    }
    rng = random.Random(0)
    for kind, pool in pools.items():
        pools[kind] = [text for text in pool if len(text) >= MIN_CHARS]
        rng.shuffle(pools[kind])
    return pools


def train(
    output: str, max_steps: int, eval_steps: int, draft_vocab_size: int, anchors_per_sequence: int,
    target_dtype: str, resume: str | None = None,
) -> None:
    """`dart-hf train` on the training split; `resume` (a checkpoint folder) continues its weights, optimizer and
    step count, the cosine schedule then stretched to the new `max_steps`."""
    config = {
        "target": TARGET, "train_files": [str(DATA / "train.jsonl")], "eval_files": [str(DATA / "heldout.jsonl")],
        "output_dir": output, "max_steps": max_steps, "per_device_train_batch_size": 8,
        "learning_rate": 5e-4, "lr_scheduler_type": "cosine", "warmup_steps": 20, "max_grad_norm": 0.5,
        "draft_vocab_size": draft_vocab_size, "anchors_per_sequence": anchors_per_sequence,
        "max_length": MAX_LENGTH,
        "feature_dropout": 0.1, "train_sampling_strategy": "group_by_length",
        "eval_strategy": "steps", "eval_steps": eval_steps, "save_steps": eval_steps, "save_total_limit": 3,
        # one held-out example at a time: every reply token is an anchor there, and the teacher's 262,144-token
        # logits over all those rows take gigabytes per example
        "per_device_eval_batch_size": 1,
        "logging_steps": 10, "report_to": "none", "use_cpu": True, "target_dtype": target_dtype,
        "early_stopping_patience": 3, "dataloader_num_workers": 0, "seed": 1,
    }
    if resume:
        config["resume_from_checkpoint"] = resume
    train_sitting(config, DATA / "train_config.json")


def build_ngram(folder: Path) -> None:
    """The draft's trigram table from the training split, saved beside the draft."""
    build_ngram_table(DATA / "train.jsonl", folder, 262144,
                      "Gemma 3 270M's greedy continuations (training split), prompts included")


RESULTS = """Measured with `benchmarks/bench_sliding_window.py --draft gemma3-270m-dart --untrained-too` on a 2-core
AMD EPYC CPU (`avx512_bf16`, no AMX): greedy, float32, text-continuation prompts (the first 96 tokens of texts from
CNN/DailyMail, HumanEval, MT-Bench, GSM8K and AlpacaEval; none is a training prompt), every run generating exactly
the stated number of new tokens; vanilla `generate`, this draft and an untrained draft (the same architecture,
random weights, a 32,768-token vocabulary) interleaved prompt by prompt after an untimed warm-up. Speedup is the
total-time ratio over vanilla with its 95% bootstrap interval over the prompts; tau is tokens committed per
verification (a drafted tree or a context-lookup chain); "lookup" is the share of verifications that checked a
chain copied from earlier in the text instead of a drafted tree. The 960-token run measured this draft's
checkpoint at step 240 (`drafts/gemma3-270m` then; its held-out figures are in the table under Training).

{table}

Greedy continuations of a base model fall into repeating loops, which context lookup copies whatever the draft: at
960 new tokens (over twice the 512-token sliding window) lookup carries most steps and the trained draft adds
little over an untrained one; at 128 new tokens the drafted trees matter more. Part of every DART figure on this CPU
is the tree forward's products taken weight first (dart-hf's `weight_major`): the target's 262,144-token output
layer takes about 41 ms for one row and 35 ms for eight that way, so a tree of a few nodes costs less than vanilla's
one-token step."""

TRAINING = """Data (`data/gemma3/`): {data}

Recipe (`examples/train_gemma3_draft.py`, on a 2-core CPU): one decoder layer, 16,384-token draft vocabulary (the
most frequent reply tokens), prefix-shared masked training with 24 anchors per sequence, loss
`sum_k 0.6^k KL(p_target || q_draft)` on reply tokens (soft labels from the target in bfloat16), AdamW, learning
rate 5e-4 with a cosine schedule (20 warm-up steps), batch 8, sequences up to {max_length} tokens, feature dropout
0.1. {steps} steps in two sittings of about 43 minutes: 240 steps with the cosine schedule over 240, then resumed
from that checkpoint (`--resume`) to 480 with the schedule stretched to 480 (the rate back at 2.5e-4, decaying to
0); every 20th continuation held out. Held-out agreement (alpha_k: how often the draft's k-th
token is the target's greedy one, the tokens before it being the target's; chain tau: tokens per step of a chain of
the draft's top tokens, verified greedily):

{history}"""

LIMITATIONS = """- A first draft in about two CPU-hours of data and training (32 minutes of self-distillation, 85 of training;
  1,330 greedy continuations of 256 tokens): it predicts the next token fairly well (held-out alpha_1 47%) and
  the later ones little better than the most frequent token (alpha_2..8 about 16%); the paper's drafts reach
  about 75%. Between steps 360 and 480 alpha_1 nearly stopped rising and alpha_2..8 did not move, so more
  steps on this data will not help: continuations less repetitive than greedy ones (sampled, or from more varied
  prompts) are the next gain.
- Gemma 3 270M is a base model: the draft was trained on text continuation, not on chat turns.
- The draft is a Model Derivative of Gemma 3 under the Gemma Terms of Use (https://ai.google.dev/gemma/terms) and
  its Prohibited Use Policy; its use is bound by them."""


def benchmark_table(results: list[dict]) -> str:
    """A markdown table of `bench_sliding_window.py` result files (a trained `dart` run beside `dart_untrained`)."""
    rows = ["| new tokens | prompts | draft | identical to vanilla | speedup [95% CI] | tau | lookup |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for result in results:
        new_tokens = result["rows"][0]["total_tokens"] - result["rows"][0]["prompt_tokens"]
        for name in ("dart", "dart_untrained"):
            figures, label = result[name], result["drafts"][name]
            low, high = figures["ci95"]
            rows.append(f"| {new_tokens} | {result['prompts']} | {label} | {figures['identical']}/{result['prompts']} "
                        f"| {figures['speedup']:.2f}x [{low:.2f}-{high:.2f}] | {figures['tau']:.2f} "
                        f"| {figures['lookup_steps'] / max(figures['verify_steps'], 1):.0%} |")
    return "\n".join(rows)


def write_model_card(result_files: list[Path]) -> None:
    """`model_cards/gemma3-270m-dart.md` from `bench_sliding_window.py` results and the recipe above."""
    from dart_hf.model_card import alpha_history_table, draft_model_card
    from dart_hf.zoo import GEMMA3_HUB_ID, draft_path, load_draft, load_target

    target, _ = load_target(TARGET, dtype=torch.float32)
    draft = load_draft(DRAFT_NAME, target)
    state = json.loads((Path(draft_path(DRAFT_NAME)) / "trainer_state.json").read_text())
    results = RESULTS.format(table=benchmark_table([json.loads(path.read_text()) for path in result_files]))
    training = TRAINING.format(data=(DATA / "README.md").read_text().split("\n", 1)[1].strip(),
                               max_length=MAX_LENGTH, steps=state["global_step"],
                               history=alpha_history_table(state["log_history"]))
    card = draft_model_card(draft, f"dart-hf/{DRAFT_NAME}", base_model=GEMMA3_HUB_ID, results=results,
                            training=training, license="gemma", limitations=LIMITATIONS, chat=False)
    path = Path("model_cards") / f"{DRAFT_NAME}.md"
    write_atomically(path, card.save)
    print(f"model card -> {path}")


def main() -> None:
    parser = recipe_parser(__doc__, prompts=1400, eval_steps=100, draft_vocab_size=16384, output="drafts/gemma3-270m")
    parser.add_argument("--ngram", type=Path, default=None, help="only build the N-gram table into this folder")
    parser.add_argument("--export", type=Path, default=None, help="ship this checkpoint (bfloat16) in the package")
    parser.add_argument("--card", type=Path, nargs="+", default=None,
                        help="write the model card from these `bench_sliding_window.py --untrained-too` results")
    args = parser.parse_args()
    if args.export:
        return ship_recipe_draft(args.export, TARGET, DRAFT_NAME, build_ngram)
    if args.card:
        return write_model_card(args.card)
    if args.ngram:
        return build_ngram(args.ngram)
    if args.alphas:
        return print(json.dumps(held_out_alphas(TARGET, args.alphas, DATA / "heldout.jsonl", MAX_LENGTH), indent=2))
    DATA.mkdir(parents=True, exist_ok=True)
    dtype = recipe_dtype(args.dtype)
    if args.distill_minutes > 0:
        prompts = interleaved_prompt_file(DATA / "prompts.jsonl", prompt_pools(), KIND_MIX, args.prompts)
        self_distill_sitting(TARGET, prompts, DATA / "selfdistill.jsonl", args.distill_minutes,
                             "--prompt-tokens", str(PROMPT_TOKENS), "--max-new-tokens", str(NEW_TOKENS),
                             "--batch-size", "16", "--dtype", dtype)
    if args.max_steps > 0:
        split_held_out(DATA / "selfdistill.jsonl", DATA)
        train(args.output, args.max_steps, args.eval_steps, args.draft_vocab_size, args.anchors_per_sequence,
              dtype, args.resume)
        build_ngram(Path(args.output))


if __name__ == "__main__":
    main()
