"""Recipe for a DART draft for Qwen2.5-Coder-1.5B-Instruct (a chat model at the size users run), in resumable
CPU sittings: data (self-distilled replies, appended to), training (resumable checkpoints), N-gram table.

    python examples/train_qwen_coder_draft.py --prompts 1600 --distill-minutes 45     # a sitting of data; rerun
    python examples/train_qwen_coder_draft.py --max-steps 240 --eval-steps 60 --output drafts/qwen-coder-1.5b
    python examples/train_qwen_coder_draft.py --max-steps 480 --eval-steps 60 \
        --resume drafts/qwen-coder-1.5b/checkpoint-240
    python examples/train_qwen_coder_draft.py --alphas drafts/qwen-coder-1.5b/checkpoint-480   # held-out alpha_1..8
    python examples/train_qwen_coder_draft.py --export drafts/qwen-coder-1.5b   # ship it (bfloat16) in the package
    python examples/train_qwen_coder_draft.py --max-steps 180 --eval-steps 60 --freeze-lm-head \
        --init-draft qwen2.5-coder-1.5b-instruct-dart --output drafts/qwen-coder-1.5b-next   # on from the shipped one
    dart-hf bench --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-1.5b-instruct-dart \
        --dtype bfloat16 --max-new-tokens 128 --sets humaneval mbpp mt-bench gsm8k \
        --methods vanilla assisted prompt_lookup dart --out benchmarks/results/qwen_coder_1.5b_bf16
    python examples/train_qwen_coder_draft.py --card benchmarks/results/qwen_coder_1.5b_bf16.json   # model card

Prompts come from the training prompt sets only (none is a benchmark prompt: `dart_hf.prompts.training_prompts`
drops every prompt of HumanEval, MBPP, MT-Bench, GSM8K and the other benchmark sets), mixed in KIND_MIX's
proportions in a seeded order: code (functions of Python's standard library to complete or write, as HumanEval and
MBPP ask), open-ended chat, and maths. The target answers each greedily, and labels every token with its own
distributions during training, in the CPU's fast dtype (`--dtype auto`: bfloat16 where it multiplies bfloat16
natively, else float32; the two dtypes' greedy replies differ only where the leading logits nearly tie).
"""

import json
import random
from pathlib import Path

import torch

from dart_hf.files import write_atomically
from dart_hf.prompts import training_prompts
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

DATA = Path("data/qwen_coder")
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT_NAME = "qwen2.5-coder-1.5b-instruct-dart"
NEW_TOKENS = 256
MAX_LENGTH = 640  # chat prompt and reply
# per 20 prompts: the benchmark is two code sets (HumanEval, MBPP), one chat set (MT-Bench) and maths (GSM8K)
KIND_MIX = {"code": 8, "open-ended": 8, "math": 4}
MIN_CHARS = 30  # shorter prompts (a lone word, as some OpenAI evals prompts are) teach little


def prompt_pools() -> dict[str, list[str]]:
    """Each kind's prompts of MIN_CHARS or more, from training sets only, each in a `random.Random(0)` shuffle."""
    pools = {
        "code": training_prompts(["python-stdlib"]),
        "open-ended": training_prompts(["arena-hard", "alpaca-demo", "openai-evals", "ifeval", "chitchat"]),
        "math": training_prompts(["math-train"]),
    }
    rng = random.Random(0)
    for kind, pool in pools.items():
        pools[kind] = [text for text in pool if len(text) >= MIN_CHARS]
        rng.shuffle(pools[kind])
    return pools


def train(
    output: str, max_steps: int, eval_steps: int, draft_vocab_size: int, anchors_per_sequence: int,
    target_dtype: str, resume: str | None = None, init_draft: str | None = None, freeze_lm_head: bool = False,
) -> None:
    """`dart-hf train` on the training split, the target's features cached once (9 KB a token in bfloat16) rather
    than recomputed every epoch; `resume` (a checkpoint folder) continues its weights, optimizer and step count;
    `init_draft` (a shipped draft's name or a folder) starts from its weights with a fresh optimizer and schedule,
    and with `freeze_lm_head` keeps its output layer as it is."""
    config = {
        "target": TARGET, "train_files": [str(DATA / "train.jsonl")], "eval_files": [str(DATA / "heldout.jsonl")],
        "output_dir": output, "max_steps": max_steps, "per_device_train_batch_size": 8,
        "learning_rate": 5e-4, "lr_scheduler_type": "cosine", "warmup_steps": 20, "max_grad_norm": 0.5,
        "draft_vocab_size": draft_vocab_size, "anchors_per_sequence": anchors_per_sequence,
        "max_length": MAX_LENGTH,
        "feature_dropout": 0.1, "feature_cache_dir": str(DATA / "features"),
        "eval_strategy": "steps", "eval_steps": eval_steps, "save_steps": eval_steps, "save_total_limit": 3,
        "per_device_eval_batch_size": 1,  # the teacher's 151,936-token logits over every reply row of an example
        "logging_steps": 10, "report_to": "none", "use_cpu": True, "target_dtype": target_dtype,
        "dataloader_num_workers": 0, "seed": 1,
    }
    if resume:
        config["resume_from_checkpoint"] = resume
    if init_draft:
        config["init_draft"] = init_draft
    config["freeze_lm_head"] = freeze_lm_head  # without --init-draft `dart-hf train` refuses it, never ignores it
    train_sitting(config, DATA / "train_config.json")


def build_ngram(folder: Path) -> None:
    """The draft's trigram table from the training split (prompts and replies) into `folder`."""
    build_ngram_table(DATA / "train.jsonl", folder, 151936,
                      "Qwen2.5-Coder-1.5B-Instruct's greedy replies (training split), prompts included")


RESULTS = """Measured with `dart-hf bench` (the command below) on a 2-core AMD EPYC CPU (`avx512_bf16`, no AMX): greedy,
128 new tokens, the target in bfloat16, prompts from HumanEval, MBPP, MT-Bench (first turns) and GSM8K (none is a
training prompt), the sets taking turns one prompt at a time. Vanilla `generate`, Transformers' assisted decoding
with Qwen2.5-Coder-0.5B-Instruct as the assistant, Transformers' prompt lookup decoding (10 tokens) and DART with
this draft ran interleaved prompt by prompt, in the same process, after an untimed warm-up of each. Speedup is the
total-time ratio over vanilla bfloat16 with its 95% bootstrap interval over the prompts; DART's tau is tokens
committed per verification (a drafted tree or a context-lookup chain), with the share of verifications that
checked a chain copied from earlier in the text ("lookup").

    {command}

{table}"""

TRAINING = """Data (`data/qwen_coder/`): {data}

Recipe (`examples/train_qwen_coder_draft.py`, on a 2-core CPU): one decoder layer, 32,768-token draft vocabulary
(the most frequent reply tokens), prefix-shared masked training with 24 anchors per reply (each mask block's rows
weighted by the inverse share of anchors sampled), loss `sum_k 0.6^k KL(p_target || q_draft)` on reply tokens
(soft labels from the target in bfloat16, its features cached once), AdamW, learning rate 5e-4 with a cosine
schedule (20 warm-up steps) over {steps} steps, batch 8, sequences up to {max_length} tokens, feature dropout 0.1;
every 20th reply held out. Held-out agreement (alpha_k: how often the draft's k-th token is the target's greedy
one, the tokens before it being the target's; chain tau: tokens per step of a chain of the draft's top tokens,
verified greedily; the float32 target as teacher):

{history}"""

LIMITATIONS = """- A first draft, about two CPU-hours of training (the target's features cached in 64 minutes, 180 steps in 49)
  on 1,520 self-distilled replies, stopped inside its first epoch: on held-out replies it predicts the next token
  37% of the time and later tokens 5-6% (the paper's drafts: about 75%). Its speedup is the first drafted token
  and context lookup, so trees stay small; more steps on the same replies are the next gain (its training and
  held-out agreement were still level and rising).
- Trained and measured on single-turn chat prompts (code, open-ended, maths) of up to 640 tokens with the reply.
- Qwen2.5-Coder-1.5B-Instruct is published by the Qwen team under the Apache License 2.0; so is this draft."""


def write_model_card(summary_file: Path, command: str) -> None:
    """`model_cards/qwen2.5-coder-1.5b-instruct-dart.md` from a `dart-hf bench` summary with the peers, the shipped
    draft's training history and the recipe above."""
    from dart_hf.bench import markdown_table
    from dart_hf.model_card import alpha_history_table, draft_model_card
    from dart_hf.zoo import QWEN_CODER_1_5B_HUB_ID, draft_path, load_draft, load_target

    target, _ = load_target(TARGET, dtype=torch.bfloat16)
    draft = load_draft(DRAFT_NAME, target)
    state = json.loads((Path(draft_path(DRAFT_NAME)) / "trainer_state.json").read_text())
    results = RESULTS.format(command=command, table=markdown_table(json.loads(summary_file.read_text())))
    training = TRAINING.format(data=(DATA / "README.md").read_text().split("\n", 1)[1].strip(),
                               steps=state["max_steps"], max_length=MAX_LENGTH,
                               history=alpha_history_table(state["log_history"]))
    card = draft_model_card(draft, f"dart-hf/{DRAFT_NAME}", base_model=QWEN_CODER_1_5B_HUB_ID, results=results,
                            training=training, license="apache-2.0", limitations=LIMITATIONS)
    path = Path("model_cards") / f"{DRAFT_NAME}.md"
    write_atomically(path, card.save)
    print(f"model card -> {path}")


def main() -> None:
    parser = recipe_parser(__doc__, prompts=1600, eval_steps=60, draft_vocab_size=32768,
                           output="drafts/qwen-coder-1.5b")
    parser.add_argument("--batch-size", type=int, default=16, help="self-distillation batch")
    parser.add_argument("--init-draft", default=None, help="start training from this draft's weights (the shipped "
                        "draft's name or a folder): a fresh optimizer and schedule, unlike --resume")
    parser.add_argument("--freeze-lm-head", action="store_true", help="with --init-draft: keep its output layer "
                        "(the shipped draft's 100 MB first shard then ships unchanged)")
    parser.add_argument("--export", type=Path, default=None, help="ship this checkpoint (bfloat16) in the package")
    parser.add_argument("--card", type=Path, default=None, help="write the model card from this `dart-hf bench` "
                        "summary (.json) of the shipped draft beside the peers")
    parser.add_argument("--card-command", default="", help="the bench command the summary came from, for the card")
    args = parser.parse_args()
    if args.export:
        return ship_recipe_draft(args.export, TARGET, DRAFT_NAME, build_ngram)
    if args.card:
        return write_model_card(args.card, args.card_command)
    if args.alphas:
        return print(json.dumps(held_out_alphas(TARGET, args.alphas, DATA / "heldout.jsonl", MAX_LENGTH), indent=2))
    DATA.mkdir(parents=True, exist_ok=True)
    dtype = recipe_dtype(args.dtype)
    if args.distill_minutes > 0:
        prompts = interleaved_prompt_file(DATA / "prompts.jsonl", prompt_pools(), KIND_MIX, args.prompts)
        self_distill_sitting(TARGET, prompts, DATA / "selfdistill.jsonl", args.distill_minutes,
                             "--max-new-tokens", str(NEW_TOKENS), "--batch-size", str(args.batch_size),
                             "--dtype", dtype)
    if args.max_steps > 0:
        split_held_out(DATA / "selfdistill.jsonl", DATA)
        train(args.output, args.max_steps, args.eval_steps, args.draft_vocab_size, args.anchors_per_sequence,
              dtype, args.resume, args.init_draft, args.freeze_lm_head)
        build_ngram(Path(args.output))


if __name__ == "__main__":
    main()
