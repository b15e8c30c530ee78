"""Answering Metadata for every topic, uncached: kio's dataclasses and writer (what the handler
did before) against mink/protocol/metadata_encoding.py from the same view, in the same run.

    python -m benchmarks.metadata_encoding [--topics 1000] [--partitions 100] [--repeat 5]

A synthetic ClusterView of `--topics` x `--partitions` partitions led by three live nodes; the
handler's own function (`_encoded`) against the kio path rebuilt here; both answers are
checked equal byte for byte first. "ours" lays out every topic (nothing kept from an earlier
answer); "after one topic changed" answers a snapshot made by a delta after an answer, as a
node's view is (the handler keeps each topic's bytes while its TopicInfo is the same). Versions 1 (kcat, librdkafka's oldest) and 12 (current
clients). Median of `--repeat`. Results: `results/metadata-encoding-<ts>.json`, `.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
import uuid
from pathlib import Path

from kio.schema.errors import ErrorCode

from mink.broker.cluster.view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from mink.broker.security.operations import OMITTED
from mink.broker.server.handlers.metadata import _encoded
from mink.protocol.messages import build, encode_body, nested, response_schema

RESULTS = Path(__file__).with_name("results")


def synthetic_view(topics: int, partitions: int) -> ClusterView:
    brokers = {i: BrokerInfo(i, f"node-{i}", 9092) for i in (1, 2, 3)}
    return ClusterView(version=1, cluster_id="bench", brokers=brokers, coordinator=1, topics={
        f"topic-{t:05d}": TopicInfo(uuid.uuid4(), f"topic-{t:05d}", tuple(
            PartitionInfo(i, 1 + (t + i) % 3, 4) for i in range(partitions)))
        for t in range(topics)})


def kio_path(view: ClusterView, version: int) -> bytes:
    schema = response_schema(3, version)
    partition, topic_schema = nested(schema, "MetadataResponsePartition"), nested(
        schema, "MetadataResponseTopic")
    broker = nested(schema, "MetadataResponseBroker")
    topics = tuple(build(
        topic_schema, error_code=ErrorCode.none, name=t.name, topic_id=t.topic_id,
        is_internal=False, topic_authorized_operations=OMITTED,
        partitions=tuple(build(partition, error_code=ErrorCode.none, partition_index=p.index,
                               leader_id=p.leader, leader_epoch=p.leader_epoch,
                               replica_nodes=(p.leader,), isr_nodes=(p.leader,),
                               offline_replicas=()) for p in t.partitions))
        for t in view.topics.values())
    return encode_body(build(
        schema, throttle_time=dt.timedelta(0), cluster_id=view.cluster_id,
        brokers=tuple(build(broker, node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
                      for b in view.brokers.values()),
        controller_id=view.controller_id, topics=topics,
        cluster_authorized_operations=OMITTED, error_code=ErrorCode.none)).payload


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metadata_encoding")
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    view = synthetic_view(args.topics, args.partitions)
    rows = []
    for version in (1, 12):
        ours = _encoded(view, version, None, True)
        assert ours == kio_path(view, version), f"v{version} answers differ"
        def whole():  # nothing kept from an earlier answer: every topic laid out
            view.derived.pop("topic_bytes", None)
            _encoded(view, version, None, True)

        def after_a_change():  # a snapshot by delta (one topic moved) after an answer
            first = next(iter(view.topics.values()))
            moved = TopicInfo(first.topic_id, first.name, tuple(first.partitions))
            changed = view.with_changes(view.version + 1, view.brokers, view.coordinator, {},
                                        [first.topic_id], [moved])
            _encoded(changed, version, None, True)

        _encoded(view, version, None, True)
        row = {"version": version, "partitions": args.topics * args.partitions,
               "bytes": len(ours),
               "kio_ms": round(timed(lambda: kio_path(view, version), args.repeat) * 1000, 1),
               "ours_ms": round(timed(whole, args.repeat) * 1000, 1),
               "after_change_ms": round(timed(after_a_change, args.repeat) * 1000, 1)}
        row["speedup"] = round(row["kio_ms"] / row["ours_ms"], 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    RESULTS.mkdir(exist_ok=True)
    base = RESULTS / f"metadata-encoding-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    base.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    base.with_suffix(".md").write_text(
        f"# Metadata for every topic, uncached: {args.topics} topics x {args.partitions} "
        "partitions\n\nkio's dataclasses and writer (the handler before) against the handler's "
        "encoder, same view, same run; median of the repeats.\n\n"
        "| version | bytes | kio ms | ours ms | speedup | ours, after one topic changed ms |\n"
        "| ---: | ---: | ---: | ---: | ---: | ---: |\n"
        + "\n".join(f"| {r['version']} | {r['bytes']:,} | {r['kio_ms']} | {r['ours_ms']} | "
                    f"{r['speedup']}x | {r['after_change_ms']} |" for r in rows) + "\n")
    print(f"results: {base}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
