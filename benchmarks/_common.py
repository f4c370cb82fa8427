"""Shared by the benchmark scripts: print the results and write them as JSON when asked."""

import json
from pathlib import Path


def report(results: dict, out: Path | None) -> None:
    print(json.dumps(results, indent=2))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
