"""`mink serve`: one node of a cluster, until SIGINT or SIGTERM."""

from __future__ import annotations

import logging
import signal
from functools import partial

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
    """Serve until SIGINT or SIGTERM. The first signal starts a controlled shutdown (the
    node's partitions move to the other nodes, bounded by controlled_shutdown_timeout_ms,
    then it leaves); a second one stops at once."""
    from mink.broker.cluster.controlled_shutdown import stop_in_node
    from mink.broker.node import run_node
    from mink.storage.controlplane import NodeIdInUse

    refused: list[NodeIdInUse] = []
    started: list = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(run_node, config, on_started=started.append))

                async def stop_cleanly() -> None:
                    timeout = config.controlled_shutdown_timeout_ms / 1000
                    if started and timeout > 0:
                        await stop_in_node(started[0], timeout)
                    nursery.cancel_scope.cancel()

                async def stop_on_signal() -> None:
                    seen = 0
                    async for signum in signals:
                        seen += 1
                        name = signal.Signals(signum).name
                        if seen == 1:
                            log.info("%s received, stopping (controlled shutdown; a second "
                                     "signal stops at once)", name)
                            nursery.start_soon(stop_cleanly)
                            continue
                        log.info("%s received again, stopping at once", name)
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
