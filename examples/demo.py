"""Demo: DART tree decoding through `target.generate(..., assistant_model=draft)`.

Runs anywhere in seconds: the target is a small random Llama built in code and the draft is untrained, so the
speed-up is not the point here; what the demo shows is the one-line API, the lossless output (identical to
vanilla greedy decoding) and the statistics a DART call records. With a real target and a trained draft:

    target = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-8B")
    draft = DartDraftModel.from_pretrained("fvliang/qwen8b-dart", target=target)
    out = target.generate(**inputs, assistant_model=draft, max_new_tokens=256)
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from dart_hf import DartDraftModel


def main() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, eos_token_id=None, bos_token_id=None, pad_token_id=0,
    )
    target = AutoModelForCausalLM.from_config(config).eval()
    draft = DartDraftModel.from_target(target)  # untrained; DartDraftModel.from_pretrained(...) for a real one

    prompt = torch.randint(1, config.vocab_size, (1, 16))
    vanilla = target.generate(prompt, max_new_tokens=64, do_sample=False)
    dart = target.generate(prompt, max_new_tokens=64, do_sample=False, assistant_model=draft)

    stats = draft.stats
    print("new tokens:", dart[0, prompt.shape[1]:].tolist())
    print(f"identical to vanilla greedy: {torch.equal(dart, vanilla)}")
    print(
        f"verify steps: {stats.verify_steps} (tree budget {stats.chosen_budget}), plain decoding steps: "
        f"{stats.plain_steps} (the adaptive budget falls back to them while this untrained draft does not pay)"
    )
    print(
        f"tau: {stats.tau:.2f} tokens/step, "
        f"time draft / tree / verify: {stats.draft_time:.3f} / {stats.tree_time:.3f} / {stats.verify_time:.3f} s"
    )


if __name__ == "__main__":
    main()
