"""The `mink` command."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
from pathlib import Path

import trio

import mink
from mink.broker import cluster_cli, topics_cli
from mink.broker.config import Config, ConfigError, load_config

log = logging.getLogger("mink")


def _node_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file with node settings")
    parser.add_argument("--node-id", type=int)
    parser.add_argument("--listener", metavar="HOST:PORT")
    parser.add_argument("--advertised-listener", metavar="HOST:PORT")
    parser.add_argument("--postgres-url", metavar="URL")
    parser.add_argument("--object-store", metavar="URL",
                        help="s3://bucket/prefix, file:///path or memory://")
    parser.add_argument("--log-level")


def _overrides(args: argparse.Namespace) -> dict:
    names = ("node_id", "listener", "advertised_listener", "postgres_url", "object_store",
             "log_level")
    return {name: getattr(args, name, None) for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mink", description="A Kafka-compatible broker.")
    parser.add_argument("--version", action="version", version=f"mink {mink.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    dev = commands.add_parser("dev", help="one node with embedded PostgreSQL and a local store")
    _node_flags(dev)
    dev.add_argument("--data-dir", default=".mink", help="where PostgreSQL and the data live")

    serve = commands.add_parser("serve", help="one node of a cluster")
    _node_flags(serve)

    topics_cli.add_parser(commands)
    cluster_cli.add_parser(commands)

    args = parser.parse_args(argv)
    try:
        if args.command == "dev":
            return run_dev(args)
        if args.command == "serve":
            return run_serve(load_config(args.config, overrides=_overrides(args)))
        if args.command == "topics":
            return topics_cli.run(args)
        if args.command == "cluster":
            return cluster_cli.run(args)
    except ConfigError as exc:
        print(f"mink: {exc}", file=sys.stderr)
        return 2
    return 2


def _tune_gc() -> None:
    # Fewer, larger young collections: a node allocates many short-lived objects per request.
    gc.set_threshold(20_000, 20, 20)


def _setup_logging(config: Config) -> None:
    _tune_gc()
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_serve(config: Config) -> int:
    _setup_logging(config)
    if not config.postgres_url:
        raise ConfigError("--postgres-url (or MINK_POSTGRES_URL, or postgres_url in the "
                          "config file) is required")
    return trio.run(_run_until_signal, config)


def run_dev(args: argparse.Namespace) -> int:
    from mink.storage.embedded_postgres import EmbeddedPostgres

    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    overrides = _overrides(args)
    overrides.setdefault("object_store", None)
    if overrides["object_store"] is None:
        overrides["object_store"] = (data_dir / "data").as_uri()
    (data_dir / "data").mkdir(exist_ok=True)
    postgres = EmbeddedPostgres(data_dir / "postgres")
    if postgres.running():  # left over from a node that was killed
        postgres.stop("immediate")
    postgres.start()
    try:
        overrides["postgres_url"] = overrides["postgres_url"] or postgres.url
        config = load_config(args.config, overrides=overrides)
        _setup_logging(config)
        host, port = config.advertised_address()
        print(f"mink {mink.__version__}: one node, data in {data_dir}\n"
              f"  Kafka clients:  bootstrap.servers={host}:{port}\n"
              f"  try:            kcat -b {host}:{port} -L\n"
              f"  stop with Ctrl-C", flush=True)
        return trio.run(_run_until_signal, config)
    finally:
        postgres.stop("fast")


async def _run_until_signal(config: Config) -> int:
    from mink.broker.node import run_node
    from mink.storage.metadata import NodeIdInUse

    refused: list[NodeIdInUse] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(run_node, config)

                async def stop_on_signal() -> None:
                    async for signum in signals:
                        log.info("%s received, stopping", signal.Signals(signum).name)
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(stop_on_signal)
        except* NodeIdInUse as group:
            refused.extend(_leaves(group))
    if refused:
        exc = refused[0]
        log.error("node id %d is in use by another live process (%s:%s, renewed %.1fs ago): "
                  "not starting; give this process another node_id", config.node_id,
                  exc.host, exc.port, exc.renewed_s_ago or 0.0)
        return 2
    return 0


def _leaves(group: BaseExceptionGroup) -> list:
    out: list = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


if __name__ == "__main__":
    sys.exit(main())
