"""Exactly-once across SIGKILLs at scale: runs tests/test_transactions_eos.py (a confluent-kafka
consume-transform-produce loop over three `mink serve` subprocesses on PostgreSQL and S3
(moto), SIGKILLing in turn the output partition's leader, the transaction coordinator's node
and the group coordinator's node) with 100,000 input messages, and prints its summary line.

    .venv/bin/python -m benchmarks.eos_kill [--messages 100000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, MINK_EOS_MESSAGES=str(args.messages))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_transactions_eos.py", "-q", "-x", "-s",
         "-p", "no:cacheprovider", "-o", "timeout=1800"],
        cwd=root, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("EOS:")
             or " passed" in line or " failed" in line or line.startswith("E ")]
    print("\n".join(lines[-30:]))
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
