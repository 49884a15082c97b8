"""`python -m core SPEC.yaml --out DIR [--set k=v ...] [--resume]`: train with plain-text progress."""

from __future__ import annotations

import argparse
import sys

from core.config import SpecError, load_spec
from core.events import JsonlSink, MultiSink, PrintSink
from core.process import keep_large_allocations


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core", description=__doc__)
    ap.add_argument("spec")
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    try:
        spec = load_spec(args.spec, args.overrides)
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    from core.train import run_training

    jsonl = JsonlSink(args.out)
    try:
        summary = run_training(spec, args.out, MultiSink(jsonl, PrintSink()), resume=args.resume)
    finally:
        jsonl.close()
    return 0 if summary["status"] in ("completed", "early_stopped") else 1


if __name__ == "__main__":
    keep_large_allocations()  # this process runs one run, as a worker's run process does
    sys.exit(main())
