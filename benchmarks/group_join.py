"""How long a consumer group takes to be stable again after a member joins: the classic
protocol (JoinGroup/SyncGroup, librdkafka's cooperative-sticky assignor) against KIP-848's
consumer protocol (ConsumerGroupHeartbeat, the broker's uniform assignor), in the same run.

    python -m benchmarks.group_join [--rounds 3] [--partitions 12]

One in-process node (`mink.testing.open_node`, its own PostgreSQL); a topic of `--partitions`
partitions; three confluent-kafka consumers (subprocesses, `tests/support/kip848_consumer.py`,
which reports every assignment and revocation), then a fourth, `--rounds` times: the time from
starting the fourth until each of the four owns its share, then the fourth leaves and the
three settle again. Heartbeats every 300 ms on both protocols (the classic one's
`heartbeat.interval.ms`, the consumer one's broker setting), so the protocols differ in what
they do, not in how often they speak. Results: `results/group-join-<timestamp>.json`, `.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import trio

from mink.testing.cluster import open_node

RESULTS = Path(__file__).with_name("results")
CONSUMER = Path(__file__).parent.parent / "tests" / "support" / "kip848_consumer.py"
HEARTBEAT_MS = 300
SESSION_MS = 6000
SETTLE_TIMEOUT_S = 60.0


class Member:
    """One consumer subprocess and the partitions it owns, from its event lines."""

    def __init__(self, bootstrap: str, group: str, topic: str, protocol: str) -> None:
        extra = [f"group.protocol={protocol}"]
        if protocol == "classic":
            extra += ["partition.assignment.strategy=cooperative-sticky",
                      f"session.timeout.ms={SESSION_MS}", f"heartbeat.interval.ms={HEARTBEAT_MS}"]
        self.owned: set[int] = set()
        self.process = subprocess.Popen([sys.executable, str(CONSUMER), bootstrap, group, topic,
                                         *extra], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            event = json.loads(line)
            if event["event"] == "assigned":
                self.owned |= set(event["partitions"])
            elif event["event"] in ("revoked", "lost"):
                self.owned -= set(event["partitions"])

    def stop(self) -> None:
        self.process.terminate()  # closes the consumer: it leaves the group
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:  # librdkafka's close can hang: no matter here
            self.process.kill()
            self.process.wait()


async def settled(members: list[Member], partitions: int) -> None:
    share = partitions // len(members)
    with trio.fail_after(SETTLE_TIMEOUT_S):
        while not (sum(len(m.owned) for m in members) == partitions
                   and set().union(*(m.owned for m in members)) == set(range(partitions))
                   and all(len(m.owned) == share for m in members)):
            await trio.sleep(0.01)


async def join_times(node, protocol: str, rounds: int, partitions: int) -> list[float]:
    topic, group = f"join-{protocol}", f"join-{protocol}"
    await node.create_topic(topic, partitions=partitions)
    members = [Member(node.bootstrap, group, topic, protocol) for _ in range(3)]
    times = []
    try:
        await settled(members, partitions)
        for _ in range(rounds):
            started = time.monotonic()
            members.append(Member(node.bootstrap, group, topic, protocol))
            await settled(members, partitions)
            times.append(time.monotonic() - started)
            await trio.to_thread.run_sync(members.pop().stop)
            await settled(members, partitions)
    finally:
        for m in members:
            await trio.to_thread.run_sync(m.stop)
    return times


async def run(args) -> dict:
    settings = dict(group_consumer_heartbeat_interval_ms=HEARTBEAT_MS,
                    group_consumer_session_timeout_ms=SESSION_MS,
                    group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=1000)
    async with open_node(**settings) as node:
        out = {}
        for protocol in ("classic", "consumer"):
            times = await join_times(node, protocol, args.rounds, args.partitions)
            out[protocol] = {"seconds": [round(t, 3) for t in times],
                             "median_s": round(statistics.median(times), 3)}
            print(f"{protocol}: {out[protocol]}", flush=True)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    result = {"command": "python -m benchmarks.group_join " + " ".join(argv or sys.argv[1:]),
              "load_average_before": load, **trio.run(run, args)}
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"group-join-{stamp}.json").write_text(json.dumps(result, indent=2))
    md = [f"# A member joining a group of three, to stable again {stamp}", "",
          f"`{result['command']}`", "",
          f"{args.partitions} partitions, 3 members then a fourth, {args.rounds} rounds; "
          f"heartbeats every {HEARTBEAT_MS} ms on both protocols; load average {load:.1f}.", "",
          "| protocol | each round (s) | median (s) |", "| --- | --- | ---: |",
          *[f"| {p} | {', '.join(str(t) for t in result[p]['seconds'])} | "
            f"{result[p]['median_s']} |" for p in ("classic", "consumer")]]
    (args.out / f"group-join-{stamp}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
