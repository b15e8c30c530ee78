"""The `mink` command: `main` parses and dispatches; `dev` and `serve` run a node; `topics`
and `cluster` are the admin commands (the first through a node's Kafka listener, the second
through the shared PostgreSQL)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """The `mink` command (the console script, and `python -m mink.cli`)."""
    keep_hypothesis_out()
    from mink.cli.main import main as run

    return run(argv)


def keep_hypothesis_out() -> None:
    """kio imports Hypothesis wherever it is installed (strategies for its types), and an
    import of Hypothesis switches trio's scheduler to its deterministic test mode: every
    batch of runnable tasks sorted and shuffled, for the whole process. It also costs about
    0.3 s of start-up. A mink process never uses it, so unless something imported it
    already, importing it fails here as if it were not installed. Called by the programs
    that run a node, before anything imports kio; never by a library's import."""
    if "hypothesis" not in sys.modules:
        sys.modules["hypothesis"] = None
