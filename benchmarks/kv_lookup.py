"""Key lookups over HTTP (issue 20): latency through the partition's leader and through the
other node (forwarded to the leader), in the same run.

    python -m benchmarks.kv_lookup [--keys 20000] [--lookups 2000]

Two in-process nodes (`mink.testing.open_cluster`, admin listeners on), a compacted topic of
one partition, `--keys` keys written by confluent-kafka; once the leader's tablet answers,
`--lookups` random keys are looked up one at a time with `mink get`'s own client
(`mink.cli.get.lookup`: one HTTP connection per lookup, as the CLI makes), first at the
leader, then at the other node. Each lookup waits for the tablet to reach the high
watermark it saw, so the figures include that check. Results:
`results/kv-lookup-<ts>.json`, `.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import time
from pathlib import Path

import trio

from mink.cli.get import lookup
from mink.testing import open_cluster

RESULTS = Path(__file__).with_name("results")
TOPIC = "kv-lookup"


def produce(bootstrap: str, keys: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(keys):
        while True:
            try:
                producer.produce(TOPIC, key=b"key-%d" % i, value=b"value-%d" % i, partition=0)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def timed_lookups(admin: str, keys: list[int]) -> list[float]:
    out = []
    for i in keys:
        started = time.perf_counter()
        status, body = lookup(admin, TOPIC, 0, b"key-%d" % i, timeout=30)
        out.append(time.perf_counter() - started)
        assert status == 200 and body["value"] == f"value-{i}", (status, body)
    return out


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {"n": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)}


async def run(args) -> dict:
    async with open_cluster(2, proxy=False, admin_listener="127.0.0.1:0") as cluster:
        await cluster.create_topic(TOPIC, 1, {"cleanup.policy": "compact"})
        await cluster.wait_led(TOPIC)
        await trio.to_thread.run_sync(produce, cluster.bootstrap, args.keys)
        # Leadership may still move while the second node joins: settle on one leader whose
        # tablet answers at both nodes (the first lookups wait out its loading, not counted).
        with trio.fail_after(60):
            while True:
                leader_id = (await cluster.wait_led(TOPIC))[0]
                admin, forwarded = ("%s:%d" % cluster.node(n).node.admin_address
                                    for n in (leader_id, 2 if leader_id == 1 else 1))
                answers = [await trio.to_thread.run_sync(lookup, a, TOPIC, 0, b"key-0")
                           for a in (admin, forwarded)]
                if all(status == 200 for status, _ in answers):
                    break
                await trio.sleep(0.5)
        rng = random.Random(1)
        keys = [rng.randrange(args.keys) for _ in range(args.lookups)]
        direct = await trio.to_thread.run_sync(timed_lookups, admin, keys)
        via_other = await trio.to_thread.run_sync(timed_lookups, forwarded, keys)
    return {"keys": args.keys, "leader": percentiles(direct),
            "through_other_node": percentiles(via_other)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kv_lookup")
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--lookups", type=int, default=2_000)
    args = parser.parse_args(argv)
    result = trio.run(run, args)
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    base = RESULTS / f"kv-lookup-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(f"| {name} | {r['n']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} |"
                     for name, r in (("at the leader", result["leader"]),
                                     ("through the other node", result["through_other_node"])))
    base.with_suffix(".md").write_text(
        f"# Key lookups over HTTP: {result['keys']} keys, one compacted partition, two nodes\n\n"
        "One HTTP connection per lookup (`mink get`'s client); each waits for the tablet to "
        "reach the high watermark it saw.\n\n| lookups | n | p50 ms | p99 ms | max ms |\n"
        "| --- | ---: | ---: | ---: | ---: |\n" + rows + "\n")
    print(f"results: {base}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
