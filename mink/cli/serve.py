"""`mink serve`: one node of a cluster, until SIGINT or SIGTERM."""

from __future__ import annotations

import logging
import signal

import trio

from mink import collector
from mink.broker import logs
from mink.broker.config import Config, ConfigError

log = logging.getLogger("mink")


def run_serve(config: Config) -> int:
    setup_logging(config)
    if not config.postgres_url:
        raise ConfigError("--postgres-url (or MINK_POSTGRES_URL, or postgres_url in the "
                          "config file) is required")
    return trio.run(run_until_signal, config)


def setup_logging(config: Config) -> None:
    collector.tune()
    logs.setup(config.log_level, config.log_format)


async def run_until_signal(config: Config) -> int:
    from mink.broker.node import run_node
    from mink.storage.controlplane import NodeIdInUse

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
