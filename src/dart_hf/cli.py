"""The `dart-hf` command line.

    dart-hf generate       answer a prompt with a target and its DART draft; tau and the speedup over vanilla
    dart-hf build-ngram    a table from text / JSONL files
    dart-hf convert-trie   the reference implementation's `.trie` binary to a dart-hf table
    dart-hf self-distill   regenerate the responses of a prompt set with the target (training data)
    dart-hf train          train a draft (Trainer arguments; or one JSON / YAML config file)
    dart-hf bench          DART against vanilla generate and the peers on the packaged prompt sets
    dart-hf export-vllm    a draft as the folder vLLM serves through the dart-hf-vllm plugin
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from .arguments import positive_int, short_usage
from .hub import check_pretrained_name
from .ngram import NgramTable
from .prompts import PROMPT_SETS


def read_documents(paths: list[Path], field: str) -> Iterator[str]:
    """One document per JSONL line (`field` of each object) or per plain-text file."""
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not UTF-8 text: pass text or JSONL files.") from None
        if path.suffix in (".jsonl", ".json"):
            # split on "\n" only: str.splitlines() also splits on U+2028 inside JSON strings
            for number, line in enumerate(text.split("\n"), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number} is not JSON ({error.msg}): fix or delete that line.") from None
                if not isinstance(record, dict) or field not in record:
                    raise ValueError(f"{path}:{number} has no field {field!r}; pick the text field with --field.")
                yield record[field]
        else:
            yield text


def generate_command(args: argparse.Namespace) -> None:
    """`dart-hf generate`: answer one prompt with DART, print tau, and the speedup over interleaved vanilla runs."""
    import torch

    from .bench import chat_inputs
    from .hardware import device_clock
    from .near_ties import compare_with_vanilla
    from .zoo import load_draft, load_target

    target, tokenizer = load_target(args.target, dtype=None if args.dtype == "auto" else getattr(torch, args.dtype))
    draft = load_draft(args.draft, target)
    inputs = chat_inputs(tokenizer, args.prompt).to(target.device)
    settings = dict(max_new_tokens=args.max_new_tokens, do_sample=args.sample)
    # vanilla keeps its logits (generate copies them at every step anyway) to judge a low-precision divergence
    vanilla_settings = {**settings, "output_logits": True, "return_dict_in_generate": True}
    if not args.no_compare:  # untimed warm-up of both: one-time costs are not decoding speed
        target.generate(**inputs, **settings)
        target.generate(**inputs, assistant_model=draft, **settings)
    seconds, clock = {"vanilla": 0.0, "dart": 0.0}, device_clock(target.device)
    for _ in range(max(args.rounds, 1)):  # interleaved, so machine noise hits both alike
        if args.sample:
            torch.manual_seed(0)
        start = clock()
        output = target.generate(**inputs, assistant_model=draft, **settings)
        seconds["dart"] += clock() - start
        if not args.no_compare:
            start = clock()
            vanilla = target.generate(**inputs, **vanilla_settings)
            seconds["vanilla"] += clock() - start
    stats = draft.stats
    print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    print(
        f"\ntau {stats.tau:.2f} tokens per target forward; tree budget {stats.chosen_budget}; "
        f"{stats.plain_fraction:.0%} plain decoding steps; {stats.lookup_fraction:.0%} context-lookup steps"
    )
    if not args.no_compare:
        if args.sample:
            same = "sampled: outputs differ from vanilla's by design"
        else:  # in low precision a divergence is judged by the target's own logits (dart_hf.near_ties)
            same = compare_with_vanilla(target, inputs["input_ids"], vanilla, output)
        speedup = seconds["vanilla"] / seconds["dart"]
        print(f"speedup over vanilla generate: {speedup:.2f}x ({max(args.rounds, 1)} rounds after a warm-up); {same}")


def build_ngram(args: argparse.Namespace) -> None:
    """`dart-hf build-ngram`: count the n-grams of text / JSONL files (tokenized with the target's tokenizer)."""
    from transformers import AutoTokenizer

    check_pretrained_name(args.tokenizer, "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    table = NgramTable.from_texts(
        read_documents(args.inputs, args.field), tokenizer, order=args.order, min_count=args.min_count,
        top_k=args.top_k,
    )
    table.save(args.output)
    print(f"wrote {args.output}: {table.metadata['num_tokens']:,} tokens, {table.describe()}")


def convert_trie(args: argparse.Namespace) -> None:
    """`dart-hf convert`: the reference implementation's `.trie` table as a dart-hf table."""
    table = NgramTable.from_trie(args.trie, vocab_size=args.vocab_size)
    table.save(args.output)
    print(f"wrote {args.output}: {table.describe()}")


def self_distill_command(args: argparse.Namespace) -> None:
    """`dart-hf self-distill`: the target regenerates the replies of a prompt set (resumable JSONL)."""
    import torch

    from .prompts import training_prompts
    from .training.data import load_conversations, self_distill, tokenize_conversation
    from .zoo import load_target

    target, tokenizer = load_target(args.target, dtype=getattr(torch, args.dtype))
    conversations = [messages for path in args.prompts for messages in load_conversations(path)]
    if args.prompt_set:
        conversations += [[{"role": "user", "content": text}] for text in training_prompts(args.prompt_set)]
    prompts = [tokenize_conversation(tokenizer, messages)[0] for messages in conversations]
    prompts = prompts[: args.limit] if args.limit else prompts
    if not prompts:
        sources = [*map(str, args.prompts), *args.prompt_set]
        raise ValueError(f"No prompts in {', '.join(sources) or 'the arguments'}: pass conversation files (JSON / "
                         "JSONL) or --prompt-set NAME.")
    if args.prompt_tokens:  # text continuation for a base model: the first N tokens of each text
        prompts = [ids[: args.prompt_tokens] for ids in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    examples = self_distill(
        target, prompts, args.output, args.max_new_tokens, args.batch_size, pad_token_id=pad, scheduler=args.scheduler,
        temperature=args.temperature, seed=args.seed, max_minutes=args.max_minutes,
    )
    print(f"{args.output}: {len(examples)} examples, {sum(len(e['response_ids']) for e in examples):,} response tokens")
    if args.max_minutes is not None and len(examples) < len(prompts):
        print(f"stopped at --max-minutes {args.max_minutes:g} with {len(prompts) - len(examples)} of {len(prompts)} "
              "prompts left: rerun the same command to go on")


def export_vllm_command(args: argparse.Namespace) -> None:
    """`dart-hf export-vllm`: a draft as the folder vLLM's parallel drafting serves through dart-hf-vllm."""
    import torch

    from .export_vllm import export_vllm
    from .zoo import load_draft, load_target

    target, _ = load_target(args.target, dtype=torch.float32)
    draft = load_draft(args.draft, target)
    output = export_vllm(draft, args.output)
    print(f"wrote {output}: serve it with vLLM and the dart-hf-vllm plugin installed, speculative_config="
          f'{{"method": "eagle3", "model": "{output}", "num_speculative_tokens": {draft.config.draft_length}, '
          '"parallel_drafting": true}')


def train_command(argv: list[str]) -> None:
    """`dart-hf train`: DART + Trainer arguments (or one JSON / YAML file) -> a trained draft in `output_dir`."""
    import torch
    from transformers import EarlyStoppingCallback, HfArgumentParser, TrainingArguments

    from .modeling_dart import DartDraftModel
    from .training import DartDataCollator, DartTrainer, DartTrainingArguments, load_examples, widen_mlp
    from .training.data import conversation_examples, frequent_token_ids, load_conversations, mix_examples
    from .zoo import load_draft, load_target

    parser = HfArgumentParser((DartTrainingArguments, TrainingArguments), prog="dart-hf train")
    short_usage(parser)
    if len(argv) == 1 and argv[0].endswith(".json"):
        dart_args, training_args = parser.parse_json_file(argv[0])
    elif len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        dart_args, training_args = parser.parse_yaml_file(argv[0])
    else:
        dart_args, training_args = parser.parse_args_into_dataclasses(argv)
    training_args.remove_unused_columns = False  # the collator's loss_mask is not a forward() argument

    # the example files first: a bad one is reported before minutes of loading the target
    train_examples = load_examples(dart_args.train_files, skip_bad_lines=dart_args.skip_bad_lines)
    eval_examples = load_examples(dart_args.eval_files, skip_bad_lines=dart_args.skip_bad_lines) or None
    target, tokenizer = load_target(dart_args.target, dtype=getattr(torch, dart_args.target_dtype))
    if dart_args.existing_files:
        conversations = [c for path in dart_args.existing_files for c in load_conversations(path)]
        existing = conversation_examples(tokenizer, conversations)
        train_examples = mix_examples(train_examples, existing, dart_args.existing_ratio, seed=training_args.seed)
    if not train_examples:
        read = [*dart_args.train_files, *dart_args.existing_files]
        raise ValueError(
            (f"No training examples in {', '.join(map(str, read))} (no record with a non-empty response)"
             if read else "No training examples")
            + ": pass --train_files (JSONL from `dart-hf self-distill`) and/or --existing_files (conversations with "
            "assistant replies)."
        )
    if dart_args.init_draft:
        draft = load_draft(dart_args.init_draft, target, dtype=torch.float32)  # a shipped draft is bfloat16
        if dart_args.widen_mlp:
            draft = widen_mlp(draft, dart_args.widen_mlp)
        if dart_args.freeze_lm_head:  # Trainer's optimizer takes only the parameters that require gradients
            draft.lm_head.requires_grad_(False)
    else:
        vocab_size = target.config.get_text_config().vocab_size
        reduced = dart_args.draft_vocab_size is not None and dart_args.draft_vocab_size < vocab_size
        draft = DartDraftModel.from_target(
            target,
            feature_norm=dart_args.feature_norm,
            feature_dropout=dart_args.feature_dropout,
            mask_rep_init_std=dart_args.mask_rep_init_std,
            draft_vocab_size=dart_args.draft_vocab_size if reduced else vocab_size,
            draft_to_target_ids=frequent_token_ids(train_examples, dart_args.draft_vocab_size, vocab_size)
            if reduced
            else None,
        )
    train_dataset, eval_dataset = train_examples, eval_examples
    if dart_args.feature_cache_dir:
        from .training.feature_cache import CachedFeatureDataset, build_feature_cache

        layers = list(draft.config.feature_layers)
        with training_args.main_process_first(desc="feature cache"):  # rank 0 builds, the others then read
            cache = build_feature_cache(
                target, train_examples, layers, dart_args.feature_cache_dir,
                dtype=getattr(torch, dart_args.feature_cache_dtype),
            )
            # every evaluation would run the target over the held-out examples again; stored in float32, which
            # holds a float32 or bfloat16 target's outputs exactly, so the held-out figures are the live target's
            if eval_examples:
                eval_cache = build_feature_cache(
                    target, eval_examples, layers, Path(dart_args.feature_cache_dir) / "eval", dtype=torch.float32
                )
                eval_dataset = CachedFeatureDataset(eval_examples, eval_cache)
        train_dataset = CachedFeatureDataset(train_examples, cache)
    callbacks = []
    if dart_args.early_stopping_patience is not None:
        training_args.metric_for_best_model = "chain_tau"
        training_args.greater_is_better = True
        training_args.load_best_model_at_end = True
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=dart_args.early_stopping_patience))
    pad = target.generation_config.pad_token_id
    trainer = DartTrainer(
        model=draft.train(),
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=DartDataCollator(pad_token_id=pad if isinstance(pad, int) else 0, max_length=dart_args.max_length),
        callbacks=callbacks,
        target=target,
        gamma=dart_args.gamma,
        anchors_per_sequence=dart_args.anchors_per_sequence,
        training_attention=dart_args.training_attention,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if eval_examples:  # the held-out figures of the final weights (evaluated again only if the last step was not)
        step = trainer.state.global_step
        logged = [h for h in trainer.state.log_history if h.get("step") == step and "eval_chain_tau" in h]
        print(logged[-1] if logged else trainer.evaluate())
    if trainer.is_world_process_zero():  # the training and evaluation history beside the final weights
        trainer.state.save_to_json(str(Path(training_args.output_dir) / "trainer_state.json"))
    # under torchrun: every rank reaches here before the process group is destroyed (gloo needs that before exit;
    # a rank destroying it while rank 0 still wrote the state aborted 'terminate called' in 5 of 14 runs)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()


EXPECTED_ERRORS = (OSError, ValueError, LookupError, ImportError)  # bad input: files, formats, names, option values


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `dart-hf` command. A failure prints one line naming the problem (most name the fix too)
    and exits with status 1; `--debug` (anywhere in the arguments) or `DART_HF_DEBUG=1` shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("DART_HF_DEBUG", "") not in ("", "0")
    argv = [argument for argument in argv if argument != "--debug"]
    try:
        run_command(argv)
    except Exception as error:
        if debug:
            raise
        from tqdm.auto import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):  # a progress bar left open: end its line first
            bar.close()
        command = f"dart-hf {argv[0]}" if argv else "dart-hf"
        print(f"{command}: error: {describe_error(error)}", file=sys.stderr)
        if not isinstance(error, EXPECTED_ERRORS):
            print(f"{command}: this looks like a bug: rerun with --debug and report the traceback", file=sys.stderr)
        sys.exit(1)


def describe_error(error: Exception) -> str:
    """One line for a failure: the message (an OSError's reason and file), its first line when it runs long."""
    if isinstance(error, OSError) and error.strerror and error.filename:
        hints = {IsADirectoryError: "pass a file", NotADirectoryError: "pass a folder"}
        hint = hints.get(type(error), "check the path")
        return f"{error.strerror}: {error.filename} ({hint})"
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text ({error.reason} at byte {error.start}): pass a text file"
    message = str(error).strip() or type(error).__name__
    if isinstance(error, KeyError):
        message = f"missing key {message}"
    lines = message.split("\n")
    return lines[0] if not isinstance(error, EXPECTED_ERRORS) else " ".join(line.strip() for line in lines[:3])


def run_command(argv: list[str]) -> None:
    """Parse `argv` and run its subcommand."""
    if argv and argv[0] == "train":  # Trainer's own arguments: parsed by HfArgumentParser
        return train_command(argv[1:])
    if argv and argv[0] == "bench":
        from .bench import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="dart-hf", description="DART speculative decoding for Transformers.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("generate", help="answer a prompt with DART; print tau and the speedup over vanilla")
    run.add_argument("--target", required=True, help="target: a zoo name (smollm2-135m-instruct), Hub id or folder")
    run.add_argument(
        "--draft", required=True, help="DART draft: a shipped draft (smollm2-135m-instruct-dart), folder or Hub repo"
    )
    run.add_argument("--prompt", default="Explain speculative decoding in two sentences.")
    run.add_argument("--max-new-tokens", type=positive_int, default=128)
    run.add_argument("--sample", action="store_true", help="sample (T=1) instead of greedy decoding")
    run.add_argument("--rounds", type=positive_int, default=2, help="timed rounds of DART and vanilla, interleaved")
    run.add_argument("--no-compare", action="store_true", help="skip the vanilla run (no speedup)")
    run.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
        help="the target's dtype (auto, the default: the fastest this hardware multiplies natively, printed with "
        "the reason; float32 gives token-identical greedy outputs, bfloat16 identical up to near-ties)",
    )
    run.set_defaults(handler=generate_command)

    build = commands.add_parser("build-ngram", help="count token n-grams of text files into a table")
    build.add_argument("--tokenizer", required=True, help="tokenizer name or local path (the target's tokenizer)")
    build.add_argument("inputs", nargs="+", type=Path, help=".jsonl files (one document per line) or text files")
    build.add_argument("--field", default="text", help="JSONL field holding the text (default: text)")
    build.add_argument("--order", type=positive_int, default=3, help="n-gram order N (default: 3)")
    build.add_argument("--min-count", type=positive_int, default=1, help="drop n-grams seen fewer times (default: 1)")
    build.add_argument("--top-k", type=positive_int, default=None, help="keep only the top-k continuations per context")
    build.add_argument("--output", type=Path, default=Path("ngram.safetensors"), help="output table file")
    build.set_defaults(handler=build_ngram)

    convert = commands.add_parser(
        "convert-trie", aliases=["convert"], help="convert a reference DART .trie file into a table"
    )
    convert.add_argument("trie", type=Path)
    convert.add_argument(
        "--vocab-size", type=positive_int, required=True, help="the target model's vocabulary size (config.vocab_size)"
    )
    convert.add_argument("--output", type=Path, default=Path("ngram.safetensors"))
    convert.set_defaults(handler=convert_trie)

    distill = commands.add_parser("self-distill", help="regenerate the responses of a prompt set with the target")
    distill.add_argument("--target", required=True, help="target: a zoo name (smollm2-135m-instruct), Hub id or folder")
    distill.add_argument("prompts", nargs="*", type=Path, help="conversation files (JSON / JSONL)")
    distill.add_argument(
        "--prompt-set", action="append", default=[],
        help="a training prompt set (" + ", ".join(n for n, s in PROMPT_SETS.items() if s.role == "train")
        + "), deduplicated against the benchmarks",
    )
    distill.add_argument("--output", type=Path, required=True, help="JSONL file to append examples to (resumable)")
    distill.add_argument("--max-new-tokens", type=positive_int, default=256)
    distill.add_argument("--batch-size", type=positive_int, default=16)
    distill.add_argument("--limit", type=positive_int, default=None, help="use only the first N prompts")
    distill.add_argument(
        "--prompt-tokens", type=positive_int, default=None, metavar="N",
        help="cut each prompt to its first N tokens (a base model continuing text, as its benchmark prompts do)",
    )
    distill.add_argument(
        "--scheduler", choices=["auto", "continuous", "static"], default="auto",
        help="continuous: Transformers' continuous batching, finished rows are refilled at once; static: "
        "length-grouped left-padded batches; auto (default): continuous on a GPU, static on a CPU (faster there)",
    )
    distill.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default="float32",
        help="dtype the target generates in (float32 default: the replies are exactly what it writes; bfloat16 "
        "writes nearly the same replies faster on hardware that multiplies bfloat16 natively)",
    )
    distill.add_argument(
        "--temperature", type=float, default=0.0,
        help="0 (default): greedy replies; > 0: replies sampled at this temperature (new replies to known prompts)",
    )
    distill.add_argument("--seed", type=int, default=0, help="seed of the sampled replies")
    distill.add_argument(
        "--max-minutes", type=float, default=None,
        help="stop after this many minutes (what finished is kept; rerunning the command goes on from there)",
    )
    distill.set_defaults(handler=self_distill_command)

    export = commands.add_parser("export-vllm", help="write a draft as the folder vLLM serves (dart-hf-vllm plugin)")
    export.add_argument("draft", help="DART draft: a shipped draft's name, folder or Hub repo")
    export.add_argument("output", type=Path, help="the folder to write")
    export.add_argument("--target", required=True, help="the draft's target (a zoo name, Hub id or folder)")
    export.set_defaults(handler=export_vllm_command)

    commands.add_parser("train", help="train a draft; `dart-hf train --help` lists every argument", add_help=False)
    commands.add_parser("bench", help="benchmark DART against vanilla generate; `dart-hf bench --help`", add_help=False)

    for subparser in (parser, run, build, convert, distill, export):
        short_usage(subparser)
    args = parser.parse_args(argv)
    args.handler(args)


if __name__ == "__main__":
    main()
