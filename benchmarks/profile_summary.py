"""Where the time goes in a py-spy profile (raw/folded format, `py-spy record -f raw`).

    python -m benchmarks.profile_summary PROFILE.txt [--top 25] [--thread MainThread]
                                         [--match TEXT] [--rate 200 --seconds S]

Prints the samples per thread (when recorded with `--threads`), then the functions with the
most samples on the top of the stack (self) and anywhere in it (inclusive, each function
counted once per stack), in percent of the selected samples; with `--rate` and `--seconds`
also in percent of the wall time (py-spy leaves idle samples out, so this is how busy the
thread was). `benchmarks.kafka --profile DIR` records one such file per case.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _name(frame: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (file.py)' ; lines dropped so callers merge."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "/lib/python3", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('func')} ({path})"


def load(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        try:
            n = int(count)
        except ValueError:
            continue
        frames = [_name(f) for f in stack.split(";") if f]
        stacks.append((frames, n))
    return stacks


def summarize(stacks, top: int, match: str | None = None, thread: str | None = None,
              wall_samples: float | None = None) -> str:
    threads: collections.Counter[str] = collections.Counter()
    for frames, n in stacks:
        if frames and frames[0].startswith("thread ("):
            threads[frames[0]] += n
    header = []
    if threads:
        header.append("samples per thread: " + ", ".join(
            f"{name}: {n}"
            for name, n in threads.most_common()))
    if thread:
        stacks = [(f, n) for f, n in stacks if f and f[0].startswith("thread (")
                  and thread in f[0]]
    total = sum(n for _, n in stacks)
    if not total:
        return "\n".join(header + ["no samples"])
    if match:
        stacks = [(f, n) for f, n in stacks if any(match in x for x in f)]
    self_counts: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    for frames, n in stacks:
        if frames:
            self_counts[frames[-1]] += n
        for name in set(frames):
            incl[name] += n
    sub = sum(n for _, n in stacks)
    lines = header + [f"{total} samples" + (f" in {thread!r}" if thread else "")
                      + (f", {100 * total / wall_samples:.0f}% of the wall time"
                         if wall_samples else "")
                      + (f"; {sub} ({100 * sub / total:.1f}%) with {match!r}" if match else "")]
    lines.append("\nself (top of stack):")
    for name, n in self_counts.most_common(top):
        lines.append(f"  {100 * n / total:5.1f}%  {name}")
    lines.append("\ninclusive:")
    for name, n in incl.most_common(top):
        lines.append(f"  {100 * n / total:5.1f}%  {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_summary")
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", help="only stacks with a frame containing TEXT")
    parser.add_argument("--thread", help="only the thread whose name contains TEXT")
    parser.add_argument("--rate", type=float, help="py-spy's sampling rate (-r)")
    parser.add_argument("--seconds", type=float, help="how long it recorded")
    args = parser.parse_args(argv)
    wall = args.rate * args.seconds if args.rate and args.seconds else None
    print(summarize(load(args.profile), args.top, args.match, args.thread, wall))
    return 0


if __name__ == "__main__":
    sys.exit(main())
