"""The `mink` command."""

from __future__ import annotations

import argparse
import sys

import mink
from mink.broker.config import ConfigError, load_config
from mink.cli import acls, cluster, configs, dev, get, quotas, serve, topics, users


def _node_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file with node settings")
    parser.add_argument("--node-id", type=int)
    parser.add_argument("--listener", metavar="HOST:PORT")
    parser.add_argument("--advertised-listener", metavar="HOST:PORT")
    parser.add_argument("--listeners", metavar="NAME://HOST:PORT,...",
                        help="Kafka's listeners (replaces --listener), e.g. "
                             "SASL_SSL://0.0.0.0:9093,INTERNAL://10.0.0.1:9092")
    parser.add_argument("--advertised-listeners", metavar="NAME://HOST:PORT,...")
    parser.add_argument("--postgres-url", metavar="URL")
    parser.add_argument("--object-store", metavar="URL",
                        help="s3://bucket/prefix, file:///path or memory://")
    parser.add_argument("--log-level")
    parser.add_argument("--log-format", choices=["text", "json"])
    parser.add_argument("--admin-listener", metavar="[https://]HOST:PORT",
                        help="serve /metrics, /healthz, /readyz, /console and key lookups "
                             "here (off unless set); https:// with ssl_cert_file and "
                             "ssl_key_file")


def _overrides(args: argparse.Namespace) -> dict:
    names = ("node_id", "listener", "advertised_listener", "listeners", "advertised_listeners",
             "postgres_url", "object_store",
             "log_level", "log_format", "admin_listener")
    return {name: getattr(args, name, None) for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mink", description="A Kafka-compatible broker.")
    parser.add_argument("--version", action="version", version=f"mink {mink.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    dev_parser = commands.add_parser("dev",
                                     help="one node with embedded PostgreSQL and a local store")
    _node_flags(dev_parser)
    dev_parser.add_argument("--data-dir", default=".mink",
                            help="where PostgreSQL and the data live")

    serve_parser = commands.add_parser("serve", help="one node of a cluster")
    _node_flags(serve_parser)

    topics.add_parser(commands)
    cluster.add_parser(commands)
    configs.add_parser(commands)
    quotas.add_parser(commands)
    get.add_parser(commands)
    users.add_parser(commands)
    acls.add_parser(commands)

    args = parser.parse_args(argv)
    try:
        if args.command == "dev":
            return dev.run_dev(args, _overrides(args))
        if args.command == "serve":
            return serve.run_serve(load_config(args.config, overrides=_overrides(args)))
        if args.command == "topics":
            return topics.run(args)
        if args.command == "cluster":
            return cluster.run(args)
        if args.command == "configs":
            return configs.run(args)
        if args.command == "quotas":
            return quotas.run(args)
        if args.command == "get":
            return get.run(args)
        if args.command == "users":
            return users.run(args)
        if args.command == "acls":
            return acls.run(args)
    except ConfigError as exc:
        print(f"mink: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
