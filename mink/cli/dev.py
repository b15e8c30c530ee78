"""`mink dev`: one node on an embedded PostgreSQL and a file:// store under one folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

import mink
from mink.broker.config import load_config
from mink.cli.serve import run_until_signal, setup_logging

MISSING_EXTRA = ("mink dev needs the embedded PostgreSQL: pip install 'mink[dev]' "
                 "(or run `mink serve --postgres-url ...` against your own PostgreSQL)")


def run_dev(args: argparse.Namespace, overrides: dict) -> int:
    from mink.storage.embedded_postgres import EmbeddedPostgres, postgres_bin_path

    try:
        postgres_bin_path()
    except ImportError:
        print(f"mink: {MISSING_EXTRA}", file=sys.stderr)
        return 2

    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
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
        postgres.stop("fast")
