"""The steps a draft recipe runs on real data, shared by the recipes in `examples/`: a prompt file that only grows,
self-distillation in bounded sittings, a held-out split, the draft's N-gram table and its held-out agreement."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..files import extend_lines


def recipe_parser(description: str, prompts: int, eval_steps: int, draft_vocab_size: int, output: str):
    """The arguments every recipe takes (how many prompts, a self-distillation sitting, training steps and where
    they go, resuming, the held-out alphas of a draft), with the recipe's defaults; a recipe adds its own."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=prompts, help="how many prompts the data may use")
    parser.add_argument("--distill-minutes", type=float, default=0, help="self-distil for this long first (resumable)")
    parser.add_argument("--max-steps", type=int, default=0, help="train for this many steps (0: no training)")
    parser.add_argument("--eval-steps", type=int, default=eval_steps, help="evaluate and checkpoint this often")
    parser.add_argument("--draft-vocab-size", type=int, default=draft_vocab_size)
    parser.add_argument("--anchors-per-sequence", type=int, default=24,
                        help="mask blocks per training sequence: the supervision the depths past the first get")
    parser.add_argument("--resume", default=None, help="continue training from this checkpoint folder")
    parser.add_argument("--output", default=output)
    parser.add_argument("--alphas", default=None, help="only report this draft's held-out alpha_1..8")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                        help="the target's dtype while it writes replies and labels training rows (auto, the "
                        "default: bfloat16 where this CPU multiplies it natively, else float32)")
    return parser


def recipe_dtype(choice: str) -> str:
    """The dtype name a recipe's `--dtype` choice stands for on this CPU ("auto": its fast dtype), printed with
    the reason when it was chosen here."""
    if choice != "auto":
        return choice
    from ..hardware import default_dtype

    dtype, why = default_dtype("cpu")
    name = str(dtype).removeprefix("torch.")
    print(f"target dtype: {name} ({why})")
    return name


def interleaved_prompt_file(path: Path, pools: dict[str, list[str]], mix: dict[str, int], count: int) -> Path:
    """Write to `path` the first `count` prompts of the `pools` kinds interleaved in `mix`'s proportions (per
    round, `mix[kind]` prompts of each kind), one `{"kind", "messages"}` JSON line each. The self-distilled file's
    ids index these lines, so a larger count appends and lines already written never move."""
    taken, lines = dict.fromkeys(pools, 0), []
    while len(lines) < count:
        added = len(lines)
        for kind, share in mix.items():
            for text in pools[kind][taken[kind] : taken[kind] + share]:
                lines.append(json.dumps({"kind": kind, "messages": [{"role": "user", "content": text}]}))
            taken[kind] += share
        if len(lines) == added:
            raise ValueError(f"The prompt pools hold {len(lines)} prompts, fewer than the {count} asked for.")
    extend_lines(path, lines[:count])
    return path


def run_child(command: list[str]) -> None:
    """Run `command` to its end, raising `CalledProcessError` if it fails, as `subprocess.run(command,
    check=True)` does, but never leave it running alone: a SIGTERM to this process (`kill`, a scheduler's stop)
    stops the child first (it holds the target, gigabytes, and would go on training), and so does any exception
    here. Ctrl-C needs nothing: a terminal signals its whole foreground process group."""
    child = subprocess.Popen(command)

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        returncode = child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.terminate()
            child.wait()
    if returncode:
        raise subprocess.CalledProcessError(returncode, command)


def self_distill_sitting(target: str, prompts: Path, output: Path, minutes: float, *arguments: str) -> None:
    """`dart-hf self-distill --target target prompts --output output --max-minutes minutes *arguments` in a child
    process: no batch starts after `minutes`, what finished is on disk, and the same call again goes on."""
    command = [sys.executable, "-m", "dart_hf.cli", "self-distill", "--target", target, str(prompts),
               "--output", str(output), "--max-minutes", str(minutes), *arguments]
    run_child(command)


def train_sitting(config: dict, config_path: Path) -> None:
    """`dart-hf train config_path` in a child process, after writing `config` (its arguments) there; prints the
    minutes it took. With `resume_from_checkpoint` in `config` it continues that checkpoint's weights, optimizer
    and step count."""
    config_path.write_text(json.dumps(config, indent=2))
    start = time.time()
    run_child([sys.executable, "-m", "dart_hf.cli", "train", str(config_path)])
    print(f"trained in {(time.time() - start) / 60:.1f} min -> {config['output_dir']}")


def split_held_out(path: Path, folder: Path, every: int = 20) -> None:
    """Every `every`-th line of the self-distilled file `path` to `folder/heldout.jsonl`, the others to
    `folder/train.jsonl`."""
    lines = path.read_text().strip().split("\n")
    (folder / "heldout.jsonl").write_text("\n".join(line for i, line in enumerate(lines) if i % every == 0) + "\n")
    (folder / "train.jsonl").write_text("\n".join(line for i, line in enumerate(lines) if i % every) + "\n")


def build_ngram_table(train_file: Path, folder: Path, vocab_size: int, source: str) -> None:
    """The draft's trigram table from the examples in `train_file` (prompts and replies), saved as
    `folder/ngram.safetensors` with `source` in its metadata."""
    from ..ngram import NgramTable
    from .data import load_examples

    examples = load_examples([train_file])
    table = NgramTable.from_sequences((e["prompt_ids"] + e["response_ids"] for e in examples),
                                      vocab_size=vocab_size, order=3)
    table.metadata["source"] = source
    table.save(folder / "ngram.safetensors")
    print(f"N-gram table: {table.describe()} -> {folder / 'ngram.safetensors'}")


def ship_recipe_draft(checkpoint: Path, target: str, draft_name: str, build_ngram) -> None:
    """Ship `checkpoint` as the package's draft `draft_name` (`dart_hf.zoo.ship_draft`: bfloat16 weights, renamed
    into place), bound to the zoo target `target` in float32; `build_ngram(checkpoint)` first writes its N-gram
    table from the recipe's data if the checkpoint has none."""
    from ..zoo import load_target, ship_draft

    if not (checkpoint / "ngram.safetensors").exists():
        build_ngram(checkpoint)
    target_model, _ = load_target(target, dtype=torch.float32)
    print(f"shipped {checkpoint} as {draft_name} -> {ship_draft(checkpoint, draft_name, target_model)}")


def held_out_alphas(target: str, draft_folder: str, heldout: Path, max_length: int) -> dict:
    """alpha_1..8 and chain tau of `draft_folder` on the examples in `heldout`, the float32 target as teacher."""
    from ..zoo import load_draft, load_target
    from .data import DartDataCollator, load_examples
    from .trainer import evaluate_draft

    target_model, _ = load_target(target, dtype=torch.float32)
    draft = load_draft(draft_folder, target_model)
    return evaluate_draft(draft, target_model, load_examples([heldout]), DartDataCollator(max_length=max_length))
