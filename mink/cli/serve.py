"""`mink serve`: one node of a cluster, until SIGINT or SIGTERM."""

from __future__ import annotations

import gc
import logging
import signal

import trio

from mink.broker.config import Config, ConfigError

log = logging.getLogger("mink")


def run_serve(config: Config) -> int:
    setup_logging(config)
    if not config.postgres_url:
        raise ConfigError("--postgres-url (or MINK_POSTGRES_URL, or postgres_url in the "
                          "config file) is required")
    return trio.run(run_until_signal, config)


def setup_logging(config: Config) -> None:
    # Fewer, larger young collections: a node allocates many short-lived objects per request.
    gc.set_threshold(20_000, 20, 20)
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def run_until_signal(config: Config) -> int:
    from mink.broker.node import run_node

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_node, config)

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("%s received, stopping", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
    return 0
