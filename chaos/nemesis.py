"""The faults (nemesis). Each class is one function that causes the fault, holds it for a window
drawn from the run's random generator, ends it, and records both ends in the history.

Timings are relative to the cluster's `lease_ttl` (L): a pause of a node for longer than L
makes it a zombie leader that must find itself fenced; PostgreSQL faults come shorter than
L / 3 (nothing may move) and longer than L (every node stops leading and comes back).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos.campaign import Campaign

log = logging.getLogger("chaos")


def _hold(c: Campaign, seconds: float) -> None:
    c.sleep(seconds)


def kill(c: Campaign, rng: random.Random) -> dict[str, Any]:
    coordinator = c.coordinator_node()
    target_coordinator = rng.random() < 0.4  # drawn always: the schedule stays the seed's
    if coordinator is not None and target_coordinator:
        node = c.nodes[coordinator]
    else:
        node = rng.choice(list(c.nodes.values()))
    down = rng.uniform(0.5, 2 * c.lease_ttl)
    detail = {"node": node.node_id, "coordinator": node.node_id == coordinator,
              "down_s": round(down, 2)}
    c.fault_start("kill", detail)
    node.kill()
    _hold(c, down)
    node.start()
    return detail


def pause(c: Campaign, rng: random.Random) -> dict[str, Any]:
    node = rng.choice(list(c.nodes.values()))
    seconds = rng.uniform(c.lease_ttl + 0.5, 3 * c.lease_ttl)
    detail = {"node": node.node_id, "coordinator": node.node_id == c.coordinator_node(),
              "paused_s": round(seconds, 2)}
    c.fault_start("pause", detail)
    node.pause()
    _hold(c, seconds)
    node.resume()
    return detail


def pg_restart(c: Campaign, rng: random.Random) -> dict[str, Any]:
    short = rng.random() < 0.5
    down = rng.uniform(0.1, 1.0) if short else rng.uniform(c.lease_ttl, 3 * c.lease_ttl)
    detail = {"down_s": round(down, 2)}
    c.fault_start("pg-restart", detail)
    c.postgres.stop_immediate()
    _hold(c, down)
    c.postgres.start()
    return detail


def pg_pause(c: Campaign, rng: random.Random) -> dict[str, Any]:
    short = rng.random() < 0.5
    seconds = (rng.uniform(0.3, c.lease_ttl / 3) if short
               else rng.uniform(c.lease_ttl + 1, 4 * c.lease_ttl))
    detail = {"paused_s": round(seconds, 2)}
    c.fault_start("pg-pause", detail)
    c.postgres.pause()
    _hold(c, seconds)
    c.postgres.resume()
    return detail


def pg_cut(c: Campaign, rng: random.Random) -> dict[str, Any]:
    """The node behind the PostgreSQL proxy loses PostgreSQL only."""
    proxy = c.pg_proxy
    mode = rng.choice(["cut", "stall", "drop_replies"])
    seconds = rng.uniform(0.5, 3 * c.lease_ttl)
    detail = {"node": c.pg_proxy_node, "mode": mode, "seconds": round(seconds, 2)}
    c.fault_start("pg-cut", detail)
    if mode == "cut":
        proxy.cut()
    elif mode == "stall":
        proxy.stall()
    else:
        proxy.drop_replies(True)
    try:
        _hold(c, seconds)
    finally:
        proxy.restore()
        proxy.resume()
        proxy.drop_replies(False)
    return detail


def s3_errors(c: Campaign, rng: random.Random) -> dict[str, Any]:
    error_rate = rng.uniform(0.2, 1.0)
    lost_reply_rate = rng.choice([0.0, rng.uniform(0.1, 0.5)])
    seconds = rng.uniform(3, 10)
    detail = {"error_rate": round(error_rate, 2), "lost_reply_rate": round(lost_reply_rate, 2),
              "seconds": round(seconds, 2)}
    c.fault_start("s3-errors", detail)
    c.s3_proxy.error_rate, c.s3_proxy.lost_reply_rate = error_rate, lost_reply_rate
    try:
        _hold(c, seconds)
    finally:
        c.s3_proxy.heal()
    return detail


def s3_slow(c: Campaign, rng: random.Random) -> dict[str, Any]:
    delay = rng.uniform(0.3, 3.0)
    seconds = rng.uniform(3, 10)
    detail = {"delay_s": round(delay, 2), "seconds": round(seconds, 2)}
    c.fault_start("s3-slow", detail)
    c.s3_proxy.delay = delay
    try:
        _hold(c, seconds)
    finally:
        c.s3_proxy.heal()
    return detail


def s3_outage(c: Campaign, rng: random.Random) -> dict[str, Any]:
    how = rng.choice(["refused", "moto-stopped"])
    seconds = rng.uniform(3, 12)
    detail = {"how": how, "seconds": round(seconds, 2)}
    c.fault_start("s3-outage", detail)
    if how == "refused":
        c.s3_proxy.refuse = True
    else:
        c.moto.pause()
    try:
        _hold(c, seconds)
    finally:
        c.s3_proxy.heal()
        c.moto.resume()
    return detail


def _clock_step(c: Campaign, rng: random.Random, name: str, clock: Any,
                max_step: float) -> dict[str, Any]:
    step = rng.choice([-1, 1]) * rng.uniform(1.0, max_step)
    seconds = rng.uniform(3, 10)
    detail = {"step_s": round(step, 2), "seconds": round(seconds, 2)}
    if name == "clock-node":
        detail["node"] = c.clock_node
    c.fault_start(name, detail)
    clock.set(step)
    try:
        _hold(c, seconds)
    finally:
        clock.set(0.0)
    return detail


def clock_pg(c: Campaign, rng: random.Random) -> dict[str, Any]:
    """PostgreSQL's clock is the lease clock: forward expires leases, backward extends them."""
    return _clock_step(c, rng, "clock-pg", c.pg_clock, 3 * c.lease_ttl)


def clock_node(c: Campaign, rng: random.Random) -> dict[str, Any]:
    return _clock_step(c, rng, "clock-node", c.node_clock, 60.0)


FAULTS: dict[str, Callable[[Campaign, random.Random], dict[str, Any]]] = {
    "kill": kill,
    "pause": pause,
    "pg-restart": pg_restart,
    "pg-pause": pg_pause,
    "pg-cut": pg_cut,
    "s3-errors": s3_errors,
    "s3-slow": s3_slow,
    "s3-outage": s3_outage,
    "clock-pg": clock_pg,
    "clock-node": clock_node,
}
GROUPS = {
    "mixed": list(FAULTS),
    "all": list(FAULTS),
    "nodes": ["kill", "pause"],
    "pg": ["pg-restart", "pg-pause", "pg-cut"],
    "s3": ["s3-errors", "s3-slow", "s3-outage"],
    "clock": ["clock-pg", "clock-node"],
    "none": [],
}


def parse_faults(spec: str) -> list[str]:
    names: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part in GROUPS:
            names += GROUPS[part]
        elif part in FAULTS:
            names.append(part)
        else:
            raise ValueError(f"unknown fault {part!r}; known: {', '.join([*FAULTS, *GROUPS])}")
    return list(dict.fromkeys(names))


def run_schedule(c: Campaign, rng: random.Random, names: list[str], until: float) -> None:
    """Faults one after another, with quiet gaps, until `until` (history time). Classes are
    drawn from a shuffled bag, so that a mixed run of a few minutes causes every one."""
    bag: list[str] = []
    while c.history.now() < until:
        c.sleep(min(rng.uniform(1.0, 5.0), max(0.0, until - c.history.now())))
        if not names or c.history.now() >= until - 1.0:
            continue
        if len(names) == 1:
            name = rng.choice(names)  # (a draw all the same: seeds of earlier runs reproduce)
        else:
            if not bag:
                bag = list(names)
                rng.shuffle(bag)
            name = bag.pop()
        t0 = time.monotonic()
        try:
            detail = FAULTS[name](c, rng)
        except Exception as exc:
            log.exception("fault %s failed", name)
            c.fault_end(name, {"error": repr(exc)})
            c.heal()
            continue
        c.fault_end(name, detail)
        log.info("fault %s %s (%.1f s)", name, detail, time.monotonic() - t0)
