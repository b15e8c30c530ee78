"""`mink dev`: one node on an embedded PostgreSQL and a file:// store under one folder."""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
from pathlib import Path

import trio

import mink
from mink.broker.config import load_config
from mink.cli.serve import run_until_signal, setup_logging

MISSING_EXTRA = ("mink dev needs the embedded PostgreSQL: pip install 'mink[dev]' "
                 "(or run `mink serve --postgres-url ...` against your own PostgreSQL)")


def run_dev(args: argparse.Namespace, overrides: dict) -> int:
    from mink.storage.embedded_postgres import postgres_bin_path

    try:
        postgres_bin_path()
    except ImportError:
        print(f"mink: {MISSING_EXTRA}", file=sys.stderr)
        return 2

    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock_data_dir(data_dir)
    if lock is None:
        return 2
    try:
        return _run_dev(args, overrides, data_dir)
    finally:
        os.close(lock)


def _lock_data_dir(data_dir: Path) -> int | None:
    """The data folder is this process's until it exits (a kernel lock: a killed node's goes
    with it), as a Kafka broker locks its log.dirs. A second `mink dev` of the same folder
    would otherwise stop the first one's PostgreSQL, taking it for a killed node's."""
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        print(f"mink: {data_dir} is in use by another mink dev (pid {owner}); stop it first "
              f"or pass --data-dir", file=sys.stderr)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _run_dev(args: argparse.Namespace, overrides: dict, data_dir: Path) -> int:
    from mink.storage.embedded_postgres import EmbeddedPostgres

    overrides = dict(overrides)
    if overrides.get("object_store") is None:
        overrides["object_store"] = (data_dir / "data").as_uri()
    (data_dir / "data").mkdir(exist_ok=True)
    postgres = EmbeddedPostgres(data_dir / "postgres")
    if postgres.running():  # left over from a node that was killed
        postgres.stop("immediate")
    postgres.start()
    try:
        overrides["postgres_url"] = overrides.get("postgres_url") or postgres.url
        config = load_config(args.config, overrides=overrides)
        setup_logging(config)
        host, port = config.advertised_address()
        admin = config.admin_address()
        admin_line = (f"  admin:          {config.admin_scheme()}://{admin[0]}:{admin[1]}"
                      f"/metrics, /healthz, "
                      f"/readyz\n" if admin else "")
        print(f"mink {mink.__version__}: one node, data in {data_dir}\n"
              f"  Kafka clients:  bootstrap.servers={host}:{port}\n"
              f"  try:            kcat -b {host}:{port} -L\n"
              f"{admin_line}"
              f"  stop with Ctrl-C", flush=True)
        return trio.run(run_until_signal, config)
    finally:
        if postgres.running():  # (not if someone stopped it meanwhile)
            postgres.stop("fast")
        else:
            print(f"mink: PostgreSQL in {data_dir / 'postgres'} had stopped already",
                  file=sys.stderr)
