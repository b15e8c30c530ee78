"""Every benchmark, one after the other: the storage layer, then the Kafka level.

    .venv/bin/python -m benchmarks [--quick] [--out DIR]      # what `make bench` runs

Each suite writes its own results (JSON, Markdown, and PNG plots for the Kafka one) to
benchmarks/results/ or DIR. For a suite's other options run it alone:
`python -m benchmarks.storage --help`, `python -m benchmarks.kafka --help`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description="Run benchmarks.storage, then benchmarks.kafka.")
    parser.add_argument("--quick", action="store_true", help="the quick mode of both suites")
    parser.add_argument("--out", type=Path, help="directory for the results of both")
    args = parser.parse_args(argv)
    common = (["--quick"] if args.quick else []) + (["--out", str(args.out)] if args.out else [])

    from benchmarks import kafka, storage

    codes = {}
    print("== benchmarks.storage ==", flush=True)
    codes["storage"] = storage.main(list(common))
    if codes["storage"] == 130:  # interrupted: do not start the next suite
        return 130
    print("\n== benchmarks.kafka ==", flush=True)
    codes["kafka"] = kafka.main(list(common))
    failed = [name for name, code in codes.items() if code]
    if failed:
        print(f"\nfailed: {', '.join(f'{n} (exit {codes[n]})' for n in failed)}", file=sys.stderr)
        return 130 if 130 in codes.values() else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
