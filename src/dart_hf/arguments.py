"""What the `dart-hf` command lines share in parsing their arguments."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse reports anything else as a one-line usage error)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def short_usage(parser: argparse.ArgumentParser) -> None:
    """Make an argument error print two lines (where to find the usage, then the error) instead of the full usage,
    which runs to dozens of lines for the Trainer's arguments."""
    prog = parser.prog
    parser.print_usage = lambda file=None: print(f"usage: {prog} --help lists every argument", file=file)
