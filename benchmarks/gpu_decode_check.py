"""One script for a lent GPU (a few minutes): DART's decode loop on CUDA, in the dtype the hardware picks and in
float32, with no model hub (random weights, so the text is noise and the draft is untrained; what is checked is
the loop, not a speedup).

1. `hardware.default_dtype` on this GPU, and why.
2. Greedy in float32: DART token-identical to vanilla on a few prompts; in the default dtype, the near-tie
   report (`dart_hf.near_ties`) with 0 real divergences.
3. Timing: the decode loop's forward timings, which the controller prices budgets with, taken with the device
   clock (waits for the GPU) and with a bare `time.perf_counter` (launch time only), as multiples of the
   calibrated one-token cost: with the device clock they should sit near 1.
4. The calibrated costs of trees of 1 to 61 nodes relative to one token, in both dtypes.

    python benchmarks/gpu_decode_check.py --out $OUT/gpu_decode_check.json
    python benchmarks/gpu_decode_check.py --tiny   # the same code on a small CPU model, to check the script
"""

import argparse
import time
from pathlib import Path

import torch
from _common import report
from transformers import AutoModelForCausalLM, Qwen3Config

import dart_hf.generation
from dart_hf.controller_state import ForwardTimings
from dart_hf.costs import calibration_key
from dart_hf import DartDraftModel, hardware
from dart_hf.near_ties import NearTieReport, describe


def random_target(tiny: bool, dtype: torch.dtype, device: str):
    size = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=512) if tiny else \
        dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, vocab_size=151936)  # Qwen3-1.7B's shape
    torch.manual_seed(0)
    config = Qwen3Config(**size, max_position_embeddings=4096, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    with torch.device(device):  # random weights made on the GPU: faster than on the CPU and then copied
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "default"], default=["float32", "default"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = "cpu" if args.tiny else "cuda"
    dtype, why = hardware.default_dtype(device)
    results = {"device": hardware.device_description(device), "default_dtype": str(dtype), "why": why}
    prompts = [torch.randint(1, 500, (1, n), generator=torch.Generator().manual_seed(n)).to(device)
               for n in (32, 200, 700)]
    settings = dict(max_new_tokens=args.new_tokens, do_sample=False)
    for name, run_dtype in (("float32", torch.float32), ("default", dtype)):
        if name not in args.dtypes:
            continue
        target = random_target(args.tiny, run_dtype, device)
        draft = DartDraftModel.from_target(target)
        near_ties, identical = NearTieReport(), 0
        for prompt in prompts:
            vanilla = target.generate(prompt, output_logits=True, return_dict_in_generate=True, **settings)
            output = target.generate(prompt, assistant_model=draft, **settings)
            identical += bool(torch.equal(output, vanilla.sequences))
            length = prompt.shape[1]
            near_ties.add_prompt(target, prompt[0], vanilla.sequences[0, length:], torch.cat(vanilla.logits),
                                 {"dart": output[0, length:]})
        costs = draft.controller_state.costs_for(calibration_key(target))
        row = {"identical": identical, "prompts": len(prompts), "near_ties": describe(near_ties.summary("dart")),
               "tree_costs": {n: costs(n) / costs(1) for n in (1, 5, 9, 17, 33, 61) if n <= costs.node_counts[-1]}}
        for clock_name, clock in (("device clock", hardware.device_clock), ("bare perf_counter", None)):
            if clock is None:
                dart_hf.generation.device_clock = lambda device: time.perf_counter
            draft.controller_state.evidence.timings = timings = ForwardTimings()  # this clock's timings only
            target.generate(prompts[1], assistant_model=draft, **settings)
            for kind in ("plain", "verify"):
                ratios = sorted(getattr(timings, kind))
                row[f"{kind} forward / calibrated, {clock_name}"] = ratios[len(ratios) // 2] if ratios else None
            dart_hf.generation.device_clock = hardware.device_clock
        results[name] = row
        print(name, row, flush=True)
    report(results, args.out)


if __name__ == "__main__":
    main()
