"""The `dart-hf` command line. Sub-commands: `build-ngram` (a table from text / JSONL files) and `convert-trie`
(the reference implementation's `.trie` binary to a dart-hf table)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from .ngram import NgramTable


def read_documents(paths: list[Path], field: str) -> Iterator[str]:
    """One document per JSONL line (`field` of each object) or per plain-text file."""
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if path.suffix in (".jsonl", ".json"):
            # split on "\n" only: str.splitlines() also splits on U+2028 inside JSON strings
            for number, line in enumerate(text.split("\n"), start=1):
                if not line.strip():
                    continue
                record = json.loads(line)
                if field not in record:
                    raise ValueError(f"{path}:{number} has no field {field!r}; pick the text field with --field.")
                yield record[field]
        else:
            yield text


def build_ngram(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    table = NgramTable.from_texts(
        read_documents(args.inputs, args.field), tokenizer, order=args.order, min_count=args.min_count,
        top_k=args.top_k,
    )
    table.save(args.output)
    print(f"wrote {args.output}: {table.metadata['num_tokens']:,} tokens, {table.describe()}")


def convert_trie(args: argparse.Namespace) -> None:
    table = NgramTable.from_trie(args.trie, vocab_size=args.vocab_size)
    table.save(args.output)
    print(f"wrote {args.output}: {table.describe()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="dart-hf", description="DART speculative decoding for Transformers.")
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build-ngram", help="count token n-grams of text files into a table")
    build.add_argument("--tokenizer", required=True, help="tokenizer name or local path (the target's tokenizer)")
    build.add_argument("inputs", nargs="+", type=Path, help=".jsonl files (one document per line) or text files")
    build.add_argument("--field", default="text", help="JSONL field holding the text (default: text)")
    build.add_argument("--order", type=int, default=3, help="n-gram order N (default: 3)")
    build.add_argument("--min-count", type=int, default=1, help="drop n-grams seen fewer times (default: 1)")
    build.add_argument("--top-k", type=int, default=None, help="keep only the top-k continuations per context")
    build.add_argument("--output", type=Path, default=Path("ngram.safetensors"), help="output table file")
    build.set_defaults(handler=build_ngram)

    convert = commands.add_parser("convert-trie", help="convert a reference DART .trie file into a table")
    convert.add_argument("trie", type=Path)
    convert.add_argument("--vocab-size", type=int, required=True, help="the target tokenizer's vocabulary size")
    convert.add_argument("--output", type=Path, default=Path("ngram.safetensors"))
    convert.set_defaults(handler=convert_trie)

    args = parser.parse_args(argv)
    args.handler(args)


if __name__ == "__main__":
    main()
