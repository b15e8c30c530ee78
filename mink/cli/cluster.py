"""`mink cluster status`, `rebalance`, `drain` and `undrain`: read and steer the cluster
through the PostgreSQL all nodes share (any node's settings work: --postgres-url,
MINK_POSTGRES_URL, or the node's config file).

`drain NODE` marks the node draining (sql/0027), as a controlled shutdown does but without
stopping its process: the coordinator moves its partitions (and the groups and transactional
ids they coordinate) to the other live nodes and gives it nothing new, until `undrain NODE`,
which by default also asks for a rebalance so the node takes its share again. The mark
survives the node's restarts."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import trio
import trio_asyncio

from mink.broker.config import load_config
from mink.storage.controlplane import MetadataStore, MetadataUnavailable, UnknownNode
from mink.storage.controlplane.lag import group_lag


def add_parser(commands) -> None:
    cluster = commands.add_parser("cluster", help="cluster status and rebalancing")
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    for name, help_text in (("status", "nodes, epochs, liveness, partitions led, coordinator, "
                                       "consumer lag"),
                            ("rebalance", "move partitions to even out the nodes' loads")):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--postgres-url", metavar="URL")
        action.add_argument("--config", metavar="FILE")
        action.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "rebalance":
            action.add_argument("--timeout", type=float, default=60.0,
                                help="seconds to wait for the coordinator to carry it out")
    for name, help_text in (("drain", "move every partition off a node and give it no new "
                                      "work (without stopping it)"),
                            ("undrain", "let a drained node take work again (and rebalance)")):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("node_id", type=int, metavar="NODE")
        action.add_argument("--postgres-url", metavar="URL")
        action.add_argument("--config", metavar="FILE")
        action.add_argument("--json", action="store_true", help="machine-readable output")
        action.add_argument("--timeout", type=float, default=60.0,
                            help="seconds to wait for the partitions to move")
        if name == "drain":
            action.add_argument("--no-wait", action="store_true",
                                help="return once marked, without waiting for the moves")
        else:
            action.add_argument("--no-rebalance", action="store_true",
                                help="only clear the mark; partitions move back at the next "
                                     "`mink cluster rebalance`")


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, overrides={"postgres_url": args.postgres_url})
    if not config.postgres_url:
        print("mink cluster: --postgres-url (or MINK_POSTGRES_URL) is required", file=sys.stderr)
        return 2
    try:
        return trio.run(_run, args, config.postgres_url)
    except MetadataUnavailable as exc:
        print(f"mink cluster: PostgreSQL unavailable: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, url: str) -> int:
    async with trio_asyncio.open_loop():
        store = await MetadataStore.open(url, migrate=False)
        try:
            if args.cluster_command == "status":
                return _print_status(await _status(store), args.json)
            if args.cluster_command == "drain":
                return await _drain(store, args)
            if args.cluster_command == "undrain":
                return await _undrain(store, args)
            return await _rebalance(store, args)
        finally:
            await store.aclose()


async def _status(store: MetadataStore) -> dict:
    view = await store.view()
    nodes = await store.nodes()
    led = Counter(p.leader_node for t in view.topics for p in t.partitions)
    stats = await store.topic_stats()
    live = {n.node_id for n in view.nodes}
    draining = {n.node_id: n.draining for n in view.nodes}
    lag: dict[str, dict] = {}
    for group_id, topic, partition, committed, end in await group_lag(store):
        group = lag.setdefault(group_id, {"group": group_id, "lag": 0, "partitions": []})
        behind = max(0, end - committed)
        group["lag"] += behind
        group["partitions"].append({"topic": topic, "partition": partition,
                                    "committed_offset": committed, "high_watermark": end,
                                    "lag": behind})
    return {
        "cluster_id": view.cluster_id,
        "coordinator": view.coordinator,
        "nodes": [{"node_id": n.node_id, "epoch": n.epoch, "address": f"{n.host}:{n.port}",
                   "live": n.node_id in live, "partitions_led": led.get(n.node_id, 0),
                   "draining": draining.get(n.node_id)}
                  for n in nodes],
        "topics": len(view.topics),
        "topic_stats": [{"topic": t.name, "partitions": len(t.partitions),
                         "records": stats.get(t.topic_id, (0, None, None))[1],
                         "bytes": stats.get(t.topic_id, (0, None, None))[2]}
                        for t in view.topics],
        "partitions": sum(len(t.partitions) for t in view.topics),
        "orphaned_partitions": sum(1 for t in view.topics for p in t.partitions
                                   if p.leader_node not in live),
        "consumer_groups": list(lag.values()),
    }


def _print_status(status: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(status))
        return 0
    print(f"cluster {status['cluster_id']}: {status['topics']} topics, "
          f"{status['partitions']} partitions, {status['orphaned_partitions']} without a live "
          f"leader; coordinator: node {status['coordinator']}")
    print(f"{'node':>6} {'epoch':>6} {'live':>5} {'led':>6} {'draining':>9}  address")
    for n in status["nodes"]:
        print(f"{n['node_id']:>6} {n['epoch']:>6} {'yes' if n['live'] else 'no':>5} "
              f"{n['partitions_led']:>6} {n['draining'] or '-':>9}  {n['address']}")
    print(f"\n{'topic':<40} {'partitions':>10} {'records':>12} {'bytes':>14}")
    for t in status["topic_stats"]:
        records = "?" if t["records"] is None else t["records"]
        size = "?" if t["bytes"] is None else t["bytes"]
        print(f"{t['topic']:<40} {t['partitions']:>10} {records:>12} {size:>14}")
    if status["consumer_groups"]:
        print(f"\n{'group':<30} {'topic':<30} {'partition':>9} {'committed':>12} "
              f"{'end':>12} {'lag':>10}")
        for group in status["consumer_groups"]:
            for p in group["partitions"]:
                print(f"{group['group']:<30} {p['topic']:<30} {p['partition']:>9} "
                      f"{p['committed_offset']:>12} {p['high_watermark']:>12} {p['lag']:>10}")
    return 0


async def _rebalance(store: MetadataStore, args: argparse.Namespace) -> int:
    request_id = await store.request_cluster_action("rebalance")
    with trio.move_on_after(args.timeout):
        while (result := await store.cluster_request_result(request_id)) is None:
            await trio.sleep(0.2)
    if result is None:
        print(f"mink cluster: no coordinator carried out the rebalance within {args.timeout}s "
              "(is any node running?)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print(f"rebalance done: {result['moves']} partitions moved")
    return 0


async def _drain(store: MetadataStore, args: argparse.Namespace) -> int:
    node_id = args.node_id
    led = await _led_by(store, node_id)  # before the mark: the moves may start at once
    try:
        await store.drain_node(node_id, None, "operator")
    except UnknownNode:
        print(f"mink cluster: no node {node_id} ever registered", file=sys.stderr)
        return 1
    if args.no_wait:
        result = {"node_id": node_id, "draining": True, "partitions_led": len(led)}
    else:
        left = len(led)
        with trio.move_on_after(args.timeout):
            while left := await store.not_handed_over(node_id, led):
                await trio.sleep(0.1)
        if left:
            print(f"mink cluster: node {node_id} is marked draining, but {left} partitions "
                  f"were not open elsewhere within {args.timeout}s (is a coordinator "
                  "running, and another node live?)", file=sys.stderr)
            return 1
        result = {"node_id": node_id, "draining": True, "moved": len(led)}
    if args.json:
        print(json.dumps(result))
    elif args.no_wait:
        print(f"node {node_id} draining; it leads {len(led)} partitions for now")
    else:
        print(f"node {node_id} drained: {len(led)} partitions moved; it takes no new work "
              f"until `mink cluster undrain {node_id}`")
    return 0


async def _undrain(store: MetadataStore, args: argparse.Namespace) -> int:
    node_id = args.node_id
    try:
        left = await store.undrain_node(node_id)
    except UnknownNode:
        print(f"mink cluster: no node {node_id} ever registered", file=sys.stderr)
        return 1
    if left is not None:
        print(f"mink cluster: node {node_id} is stopping (controlled shutdown); it takes "
              "work again once it registers anew", file=sys.stderr)
        return 1
    result: dict = {"node_id": node_id, "draining": False}
    if not args.no_rebalance:
        request_id = await store.request_cluster_action("rebalance")
        with trio.move_on_after(args.timeout):
            while (done := await store.cluster_request_result(request_id)) is None:
                await trio.sleep(0.2)
        if done is None:
            print(f"mink cluster: node {node_id} takes work again, but no coordinator carried "
                  f"out the rebalance within {args.timeout}s", file=sys.stderr)
            return 1
        result["moves"] = done["moves"]
    if args.json:
        print(json.dumps(result))
    else:
        moved = f"; rebalance moved {result['moves']} partitions" if "moves" in result else ""
        print(f"node {node_id} takes work again{moved}")
    return 0


async def _led_by(store: MetadataStore, node_id: int) -> list:
    view = await store.view()
    return [(t.topic_id, p.partition) for t in view.topics for p in t.partitions
            if p.leader_node == node_id]
