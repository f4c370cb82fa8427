# %% [markdown]
# # dart-hf quickstart: lossless speculative decoding in one line
#
# Load a target model and a DART draft, generate, stream, and compare the speed with vanilla `generate`.
# The output is what the target alone produces: token for token in float32; in bfloat16 (`dtype="auto"` on a GPU)
# token for token up to near-ties, places where the target's two leading logits are within bfloat16 rounding of
# each other, and where vanilla itself flips between its cached and uncached forwards. On Colab, pick a GPU
# runtime: DART's token tree costs little more than one token there. The defaults use Qwen3-1.7B with the DART
# authors' released draft and N-gram table.

# %% tags=["parameters"]
TARGET = "Qwen/Qwen3-1.7B"
DRAFT = "fvliang/qwen1.7b-dart"
NGRAM = ("fvliang/dart-qwen3-ngram", "small.trie")  # (Hub repo, file) of a reference .trie table, or None
PROMPT = "Explain speculative decoding in two sentences."
MAX_NEW_TOKENS = 128

# %%
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer

from dart_hf import DartDraftModel, NgramTable
from dart_hf.hardware import device_clock
from dart_hf.near_ties import compare_with_vanilla

device = "cuda" if torch.cuda.is_available() else "cpu"
target = AutoModelForCausalLM.from_pretrained(TARGET, dtype="auto").to(device).eval()
tokenizer = AutoTokenizer.from_pretrained(TARGET)
draft = DartDraftModel.from_pretrained(DRAFT, target=target)  # bound: generate(assistant_model=draft) runs DART
if NGRAM is not None:
    from huggingface_hub import hf_hub_download

    draft.ngram = NgramTable.from_trie(hf_hub_download(*NGRAM), vocab_size=target.config.vocab_size)
print(f"draft: {sum(p.numel() for p in draft.parameters()):,} parameters, N-gram table: {draft.ngram is not None}")

# %% [markdown]
# ## Generate
# One argument, `assistant_model=draft`, switches `generate` to DART. `draft.stats` tells what the call did:
# tau is the number of tokens committed per target forward pass.

# %%
messages = [{"role": "user", "content": PROMPT}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
inputs = inputs.to(device)
output = target.generate(**inputs, assistant_model=draft, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
print(f"answer: {answer}")
print(f"tau: {draft.stats.tau:.2f} tokens per target forward; tree budget used: {draft.stats.chosen_budget}")

# %% [markdown]
# ## Stream
# Streamers work as usual.

# %%
streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
_ = target.generate(**inputs, assistant_model=draft, max_new_tokens=MAX_NEW_TOKENS, streamer=streamer)

# %% [markdown]
# ## Speed against vanilla `generate`
# The two run in turns on the same prompt, so machine noise hits both alike. The clock waits for the GPU before
# each reading. Vanilla keeps its logits, which judge a bfloat16 divergence: a near-tie when the gap between the
# two tokens' logits is within what rounding moved vanilla's own logits on this prompt.

# %%
clock = device_clock(target.device)


def timed(**kwargs):
    start = clock()
    out = target.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, **kwargs)
    return out, clock() - start


seconds = {"vanilla": 0.0, "dart": 0.0}
for _ in range(3):
    vanilla_out, vanilla_seconds = timed(output_logits=True, return_dict_in_generate=True)
    dart_out, dart_seconds = timed(assistant_model=draft)
    seconds["vanilla"] += vanilla_seconds
    seconds["dart"] += dart_seconds
print(compare_with_vanilla(target, inputs["input_ids"], vanilla_out, dart_out))
print(f"speedup over vanilla generate: {seconds['vanilla'] / seconds['dart']:.2f}x (tau {draft.stats.tau:.2f})")
