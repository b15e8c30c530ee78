"""The checker: what a history says about the promises Mink makes.

A pure function of the history (see `chaos.history` for the events). Each anomaly class is one
function below; `check` runs them all. SAFETY classes make the run fail; the others are
reported.

Safety
- lost: an acknowledged id is not in the final read.
- wrong_offset: an acknowledged id is in the final read, but not at the acknowledged
  (partition, offset).
- duplicate: an id of an idempotent producer stored at more than one offset.
- reorder: two acknowledged messages of one idempotent producer session in one partition stored
  in an order other than the order they were sent in.
- offset_conflict: one (partition, offset) read with two different ids (consumers and the
  final read together), or read by a consumer and absent from the final read.
- hole: an offset below the high watermark missing from the final read (no transactions or
  compaction exist yet, so every offset below it holds a record).
- fenced_ack: a record written by a leader that was already fenced when it was written. Decided
  from PostgreSQL's own records, in log order rather than by timestamps (PostgreSQL's clock is
  one of the things the campaign steps, and `now()` is a transaction's start, not its commit):
  * the leader-epoch cache (`leader_epochs`: the start offset of each leader epoch, written by
    OpenStream under the partition-row lock) against the leader epoch in each record's batch
    header: a record of leader epoch L at an offset at or above the start of a later epoch was
    committed after the new leader had opened the partition, i.e. by a fenced leader. A record
    whose leader epoch has no entry is reported too (OpenStream records every epoch that writes).
  * the writer of each committed range (the batch index row's WAL object, recorded in
    `wal_objects` with its node and node epoch): within one leader epoch, ranges must come from
    one node, with node epochs that never go down along the log; a range from an older node
    epoch after one from a newer epoch was committed by an incarnation that had been fenced.
- commit_backwards: a committed group offset lower than one whose commit had completed before
  this commit was sent.
- final_read_incomplete: the final read did not reach every high watermark (the other checks
  cannot be trusted then); the transactional topic's final read too.
- txn_partial: a transaction seen in part by the read_committed final read of the
  transactional topic: a committed one with any message missing, or one whose outcome the
  client could not know (`unknown`, or never ended) with some messages but not all.
- txn_aborted_visible: a message of an aborted transaction in the read_committed final read.
- txn_duplicate: a transactional message stored at more than one offset.

Reported, not failing
- duplicate_non_idempotent, reorder_non_idempotent: allowed by Kafka for producers without
  idempotence (retries), counted.
- stalled_partition (liveness): a partition not read by the group for longer than the bound
  while it had acknowledged records the group had not read.
- stalled_producer (liveness): a producer session without any acknowledgement for longer than
  the bound while it kept sending.
Liveness is asked of the cluster once a fault is over: a gap is counted from the end of the
last fault that began before the gap ended (or from the gap's start, if later), so faults
every few seconds that keep a partition moving between nodes do not make one long stall of
it. Each stall says how long the whole gap was (`seconds`) and how long of it came after the
faults (`after_faults`, what is held to the bound).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SAFETY = ("lost", "wrong_offset", "duplicate", "reorder", "offset_conflict", "hole",
          "fenced_ack", "commit_backwards", "final_read_incomplete", "txn_partial",
          "txn_aborted_visible", "txn_duplicate")
REPORTED = ("duplicate_non_idempotent", "reorder_non_idempotent", "stalled_partition",
            "stalled_producer")


@dataclass
class Facts:
    """The history, indexed."""

    run: dict[str, Any] = field(default_factory=dict)
    producers: dict[str, dict[str, Any]] = field(default_factory=dict)
    sends: dict[str, dict[str, Any]] = field(default_factory=dict)   # id -> send event
    acks: dict[str, dict[str, Any]] = field(default_factory=dict)    # id -> ack event
    fails: dict[str, dict[str, Any]] = field(default_factory=dict)
    reads: list[dict[str, Any]] = field(default_factory=list)
    commits: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    watermarks: dict[int, tuple[int, int]] = field(default_factory=dict)
    final: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    final_done: dict[str, Any] | None = None
    pg_epochs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    pg_ranges: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    end_t: float = 0.0
    # the transactional topic: txn -> its message ids, txn -> outcome; its final read
    txn_sends: dict[str, list[str]] = field(default_factory=dict)
    txn_producers: dict[str, str] = field(default_factory=dict)  # txn -> producer session
    txn_outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    txn_final: list[dict[str, Any]] = field(default_factory=list)
    txn_final_done: dict[str, Any] | None = None
    # found while indexing: a second value at one final offset
    final_conflicts: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_events(cls, events: Iterable[dict[str, Any]]) -> Facts:
        facts = cls()
        for e in events:
            kind = e["type"]
            facts.end_t = max(facts.end_t, e.get("t", 0.0))
            if kind == "run":
                facts.run = e
            elif kind == "producer":
                facts.producers[e["producer"]] = e
            elif kind == "send":
                facts.sends[e["id"]] = e
            elif kind == "ack":
                facts.acks[e["id"]] = e
            elif kind == "fail":
                facts.fails[e["id"]] = e
            elif kind == "read":
                facts.reads.append(e)
            elif kind == "commit":
                facts.commits.append(e)
            elif kind == "fault":
                facts.faults.append(e)
            elif kind == "watermark":
                facts.watermarks[e["partition"]] = (e["low"], e["high"])
            elif kind == "final":
                key = (e["partition"], e["offset"])
                seen = facts.final.get(key)
                if seen is not None and seen["id"] != e["id"]:
                    facts.final_conflicts.append({"partition": key[0], "offset": key[1],
                                                  "ids": [seen["id"], e["id"]]})
                facts.final.setdefault(key, e)
            elif kind == "final_done":
                facts.final_done = e
            elif kind == "txn_send":
                facts.txn_sends.setdefault(e["txn"], []).append(e["id"])
                facts.txn_producers[e["txn"]] = e["producer"]
            elif kind == "txn_end":
                facts.txn_outcomes[e["txn"]] = e
            elif kind == "txn_final":
                facts.txn_final.append(e)
            elif kind == "txn_final_done":
                facts.txn_final_done = e
            elif kind == "consumers_stopped":
                facts.run["consume_until"] = e["t"]
            elif kind == "pg_epochs":
                facts.pg_epochs[e["partition"]] = sorted((int(a), int(b)) for a, b in e["epochs"])
            elif kind == "pg_range":
                facts.pg_ranges.setdefault(e["partition"], []).append(e)
        return facts

    def idempotent(self, producer: str) -> bool:
        return bool(self.producers.get(producer, {}).get("idempotent"))

    def producer_of(self, message_id: str) -> str:
        send = self.sends.get(message_id)
        if send is not None:
            return send["producer"]
        return message_id.rsplit("-", 1)[0]

    def final_offsets_by_id(self) -> dict[str, list[tuple[int, int]]]:
        where: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for (partition, offset), e in sorted(self.final.items()):
            where[e["id"]].append((partition, offset))
        return where


Anomalies = dict[str, list[dict[str, Any]]]


def check_lost_and_wrong_offset(facts: Facts, out: Anomalies) -> None:
    where = facts.final_offsets_by_id()
    for message_id, ack in facts.acks.items():
        at = (ack["partition"], ack["offset"])
        stored = where.get(message_id)
        if not stored:
            holder = facts.final.get(at)
            out["lost"].append({"id": message_id, "producer": ack["producer"],
                                "partition": at[0], "offset": at[1], "acked_at": ack["t"],
                                "final_at_offset": holder["id"] if holder else None})
        elif at[1] is not None and at not in stored:
            # (librdkafka acknowledges some messages without an offset: those whose request
            # timed out but a later batch in sequence proved written; only loss is checked.)
            holder = facts.final.get(at)
            out["wrong_offset"].append({"id": message_id, "producer": ack["producer"],
                                        "acked": list(at), "stored": [list(s) for s in stored],
                                        "final_at_acked_offset": holder["id"] if holder else None})


def check_duplicates(facts: Facts, out: Anomalies) -> None:
    for message_id, stored in facts.final_offsets_by_id().items():
        if len(stored) > 1:
            producer = facts.producer_of(message_id)
            kind = "duplicate" if facts.idempotent(producer) else "duplicate_non_idempotent"
            out[kind].append({"id": message_id, "producer": producer,
                              "stored": [list(s) for s in stored],
                              "acked": ([facts.acks[message_id]["partition"],
                                         facts.acks[message_id]["offset"]]
                                        if message_id in facts.acks else None)})


def check_reorder(facts: Facts, out: Anomalies) -> None:
    # (producer, partition) -> [(seq, offset, id)] of acknowledged messages
    acked: dict[tuple[str, int], list[tuple[int, int, str]]] = defaultdict(list)
    for message_id, ack in facts.acks.items():
        send = facts.sends.get(message_id)
        if send is None or ack["offset"] is None:
            continue
        acked[(ack["producer"], ack["partition"])].append((send["seq"], ack["offset"], message_id))
    for (producer, partition), entries in sorted(acked.items()):
        entries.sort()
        kind = "reorder" if facts.idempotent(producer) else "reorder_non_idempotent"
        # one anomaly per overtaken message: the first later-sent message stored before it,
        # and how many later-sent messages were
        highest: tuple[int, int, str] | None = None
        current: dict[str, Any] | None = None
        for entry in entries:
            if highest is not None and entry[1] < highest[1]:
                if current is None or current["earlier_sent"]["id"] != highest[2]:
                    current = {"producer": producer, "partition": partition,
                               "earlier_sent": {"id": highest[2], "seq": highest[0],
                                                "offset": highest[1]},
                               "later_sent": {"id": entry[2], "seq": entry[0],
                                              "offset": entry[1]},
                               "later_sent_stored_before": 0}
                    out[kind].append(current)
                current["later_sent_stored_before"] += 1
            if highest is None or entry[1] > highest[1]:
                highest = entry


def check_offset_conflicts(facts: Facts, out: Anomalies) -> None:
    out["offset_conflict"].extend({**c, "source": "final read"} for c in facts.final_conflicts)
    seen: dict[tuple[int, int], set[str]] = defaultdict(set)
    readers: dict[tuple[int, int], set[str]] = defaultdict(set)
    for r in facts.reads:
        key = (r["partition"], r["offset"])
        seen[key].add(r["id"])
        readers[key].add(r["consumer"])
    for key, ids in sorted(seen.items()):
        final = facts.final.get(key)
        values = set(ids) | ({final["id"]} if final else set())
        if len(values) > 1:
            out["offset_conflict"].append({"partition": key[0], "offset": key[1],
                                           "ids": sorted(values),
                                           "final": final["id"] if final else None,
                                           "consumers": sorted(readers[key])})
        elif final is None and facts.final_done is not None and facts.final_done.get("complete"):
            out["offset_conflict"].append({"partition": key[0], "offset": key[1],
                                           "ids": sorted(ids), "final": None,
                                           "consumers": sorted(readers[key]),
                                           "note": "read by a consumer, absent from the final read"})


def check_holes(facts: Facts, out: Anomalies) -> None:
    offsets: dict[int, list[int]] = defaultdict(list)
    for partition, offset in facts.final:
        offsets[partition].append(offset)
    for partition, (low, high) in sorted(facts.watermarks.items()):
        present = set(offsets.get(partition, ()))
        start = None
        for offset in range(low, high):
            if offset not in present:
                if start is None:
                    start = offset
            elif start is not None:
                out["hole"].append({"partition": partition, "from": start, "to": offset - 1,
                                    "high_watermark": high})
                start = None
        if start is not None:
            out["hole"].append({"partition": partition, "from": start, "to": high - 1,
                                "high_watermark": high})


def check_final_read(facts: Facts, out: Anomalies) -> None:
    if facts.final_done is None:
        out["final_read_incomplete"].append({"note": "no final read in the history"})
    elif not facts.final_done.get("complete"):
        out["final_read_incomplete"].append({"missing": facts.final_done.get("missing")})


def check_fenced_acks(facts: Facts, out: Anomalies) -> None:
    acked_at = {(a["partition"], a["offset"]): i for i, a in facts.acks.items()
                if a["offset"] is not None}
    by_partition: dict[int, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for (partition, offset), e in facts.final.items():
        by_partition[partition].append((offset, e))

    # 1. leader epoch of each record against the leader-epoch cache
    for partition, records in sorted(by_partition.items()):
        epochs = facts.pg_epochs.get(partition)
        if not epochs:
            continue
        known = {epoch: start for epoch, start in epochs}
        epoch_list = [epoch for epoch, _ in epochs]
        flagged_epochs: set[tuple[int, str]] = set()
        for offset, e in sorted(records, key=lambda x: x[0]):
            epoch = e.get("leader_epoch")
            if epoch is None or epoch < 0:
                continue
            if epoch not in known:
                reason = "leader epoch not in the leader-epoch cache"
            else:
                i = bisect.bisect_right(epoch_list, epoch)
                if i == len(epoch_list) or offset < epochs[i][1]:
                    continue
                reason = (f"written at or after offset {epochs[i][1]}, where leader epoch "
                          f"{epochs[i][0]} started")
            if (epoch, reason) in flagged_epochs and (partition, offset) not in acked_at:
                continue
            flagged_epochs.add((epoch, reason))
            out["fenced_ack"].append({"partition": partition, "offset": offset, "id": e["id"],
                                      "leader_epoch": epoch, "acknowledged":
                                      (partition, offset) in acked_at, "reason": reason})

    # 2. writers of the committed ranges, in log order
    for partition, ranges in sorted(facts.pg_ranges.items()):
        ordered = sorted(ranges, key=lambda r: r["base"])
        last_by_epoch: dict[int, dict[str, Any]] = {}
        for r in ordered:
            first = facts.final.get((partition, r["base"]))
            epoch = first.get("leader_epoch") if first else None
            if epoch is None or r.get("node") is None:
                continue
            previous = last_by_epoch.get(epoch)
            if previous is not None:
                if previous["node"] != r["node"]:
                    reason = (f"leader epoch {epoch} written by node {previous['node']} and "
                              f"then by node {r['node']}")
                elif r["node_epoch"] < previous["node_epoch"]:
                    reason = (f"node {r['node']} epoch {r['node_epoch']} wrote after its "
                              f"epoch {previous['node_epoch']}")
                else:
                    reason = None
                if reason is not None:
                    ids = [facts.final[(partition, o)]["id"]
                           for o in range(r["base"], r["last"] + 1)
                           if (partition, o) in acked_at and (partition, o) in facts.final]
                    out["fenced_ack"].append({"partition": partition, "offsets":
                                              [r["base"], r["last"]], "key": r.get("key"),
                                              "acknowledged_ids": ids[:20], "reason": reason})
                    continue
            last_by_epoch[epoch] = r


def check_commits(facts: Facts, out: Anomalies) -> None:
    by_partition: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for c in facts.commits:
        by_partition[c["partition"]].append(c)
    for partition, commits in sorted(by_partition.items()):
        done = sorted(commits, key=lambda c: c["t"])
        done_times = [c["t"] for c in done]
        # prefix maximum of the committed offsets in completion order
        best: list[dict[str, Any]] = []
        for c in done:
            best.append(c if not best or c["offset"] > best[-1]["offset"] else best[-1])
        for c in commits:
            i = bisect.bisect_left(done_times, c["sent"])  # commits completed before c was sent
            if i and best[i - 1]["offset"] > c["offset"]:
                earlier = best[i - 1]
                out["commit_backwards"].append({
                    "partition": partition, "offset": c["offset"], "consumer": c["consumer"],
                    "sent": c["sent"], "earlier_offset": earlier["offset"],
                    "earlier_consumer": earlier["consumer"], "earlier_done": earlier["t"]})


def faults_in(facts: Facts, start: float, end: float) -> list[str]:
    """The faults that started in [start, end], as "name@t"."""
    return [f"{f['fault']}@{f['t']:.1f}" for f in facts.faults
            if f["phase"] == "start" and start <= f["t"] <= end]


def fault_ends(facts: Facts) -> list[tuple[float, float]]:
    """(start, end) of each fault, in start order; a fault never ended lasts to the end."""
    spans: list[tuple[float, float]] = []
    open_at: dict[str, list[float]] = defaultdict(list)
    for f in sorted(facts.faults, key=lambda f: f["t"]):
        if f["phase"] == "start":
            open_at[f["fault"]].append(f["t"])
        elif open_at[f["fault"]]:
            spans.append((open_at[f["fault"]].pop(0), f["t"]))
    spans += [(t, facts.end_t) for starts in open_at.values() for t in starts]
    return sorted(spans)


def counted_from(spans: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Where a gap [t0, t1] starts to count: after every fault that began before t1 and
    ended inside the gap."""
    start = t0
    for begun, ended in spans:
        if begun < t1 and ended > start:
            start = min(max(start, ended), t1)
    return start


def check_stalls(facts: Facts, out: Anomalies, bound: float) -> None:
    reads: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for r in facts.reads:
        reads[r["partition"]].append((r["t"], r["offset"]))
    acks: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for a in facts.acks.values():
        if a["offset"] is not None:
            acks[a["partition"]].append((a["t"], a["offset"]))
    end = facts.run.get("consume_until", facts.end_t)
    spans = fault_ends(facts)
    for partition in sorted(acks):
        ack_list = sorted(acks[partition])
        ack_times = [t for t, _ in ack_list]
        # highest acknowledged offset known by time t (prefix max)
        ack_max: list[int] = []
        for _, offset in ack_list:
            ack_max.append(max(offset, ack_max[-1]) if ack_max else offset)
        read_list = sorted(reads.get(partition, ()))
        points = [(0.0, -1)]
        position = -1
        for t, offset in read_list:
            position = max(position, offset)
            points.append((t, position))
        points.append((end, None))
        for (t0, pos), (t1, _) in zip(points, points[1:]):
            counted = counted_from(spans, t0, t1)
            if t1 - counted <= bound:
                continue
            # was something acknowledged and not yet read, bound seconds into the gap?
            i = bisect.bisect_right(ack_times, t1 - bound)
            if i and ack_max[i - 1] > pos:
                out["stalled_partition"].append({"partition": partition, "from": round(t0, 2),
                                                 "to": round(t1, 2),
                                                 "seconds": round(t1 - t0, 2),
                                                 "after_faults": round(t1 - counted, 2),
                                                 "position": pos, "bound": bound,
                                                 "faults_before": faults_in(facts, t0 - bound, t0 + 1.0),
                                                 "faults_during": len(faults_in(facts, t0 + 1.0, t1))})


def check_producer_stalls(facts: Facts, out: Anomalies, bound: float) -> None:
    sends: dict[str, list[float]] = defaultdict(list)
    for s in facts.sends.values():
        sends[s["producer"]].append(s["t"])
    acks: dict[str, list[float]] = defaultdict(list)
    for a in facts.acks.values():
        acks[a["producer"]].append(a["t"])
    spans = fault_ends(facts)
    for producer, send_times in sorted(sends.items()):
        send_times.sort()
        points = [send_times[0], *sorted(acks.get(producer, ())), send_times[-1]]
        points.sort()
        for t0, t1 in zip(points, points[1:]):
            counted = counted_from(spans, t0, t1)
            if t1 - counted <= bound:
                continue
            sent = bisect.bisect_right(send_times, t1 - bound) - bisect.bisect_left(send_times, t0)
            if sent > 0:
                failed = sum(1 for f in facts.fails.values()
                             if f["producer"] == producer and t0 <= f["t"] <= t1)
                out["stalled_producer"].append({"producer": producer, "from": round(t0, 2),
                                                "to": round(t1, 2), "seconds": round(t1 - t0, 2),
                                                "after_faults": round(t1 - counted, 2),
                                                "sent_meanwhile": sent, "failed_meanwhile": failed,
                                                "faults_before": faults_in(facts, t0 - bound, t0 + 1.0),
                                                 "faults_during": len(faults_in(facts, t0 + 1.0, t1))})


def check_transactions(facts: Facts, out: Anomalies) -> None:
    """The transactional topic, read read_committed: each transaction whole or not at all,
    committed ones whole, aborted ones never, nothing twice."""
    if facts.txn_final_done is None:
        return  # a history from before the transactional producer
    if not facts.txn_final_done.get("complete"):
        out["final_read_incomplete"].append({"topic": "txn",
                                             "missing": facts.txn_final_done.get("missing"),
                                             "reached": facts.txn_final_done.get("reached")})
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in facts.txn_final:
        where[e["id"]].append((e["partition"], e["offset"]))
    for message_id, places in where.items():
        if len(set(places)) > 1:
            out["txn_duplicate"].append({"id": message_id, "at": sorted(set(places))})
    for txn, ids in facts.txn_sends.items():
        outcome = facts.txn_outcomes.get(txn, {}).get("outcome", "unknown")
        seen = [i for i in ids if i in where]
        if outcome == "abort" and seen:
            out["txn_aborted_visible"].append({"txn": txn, "seen": seen})
        elif outcome == "commit" and len(seen) < len(ids):
            out["txn_partial"].append({"txn": txn, "outcome": outcome,
                                       "missing": [i for i in ids if i not in where]})
        elif outcome == "unknown" and 0 < len(seen) < len(ids):
            out["txn_partial"].append({"txn": txn, "outcome": outcome,
                                       "missing": [i for i in ids if i not in where]})


def check(events: Iterable[dict[str, Any]], stall_bound: float | None = None) -> Anomalies:
    facts = Facts.from_events(events)
    if stall_bound is None:
        stall_bound = float(facts.run.get("stall_bound", 30.0))
    out: Anomalies = {name: [] for name in SAFETY + REPORTED}
    check_final_read(facts, out)
    check_lost_and_wrong_offset(facts, out)
    check_duplicates(facts, out)
    check_reorder(facts, out)
    check_offset_conflicts(facts, out)
    check_holes(facts, out)
    check_fenced_acks(facts, out)
    check_commits(facts, out)
    check_transactions(facts, out)
    check_stalls(facts, out, stall_bound)
    check_producer_stalls(facts, out, stall_bound)
    return out


def safety_failures(anomalies: Anomalies) -> int:
    return sum(len(anomalies.get(name, ())) for name in SAFETY)


def summary(facts: Facts) -> dict[str, Any]:
    """Counts of the workload itself, for the report."""
    per_producer: dict[str, dict[str, int]] = {}
    for name, p in facts.producers.items():
        per_producer[name] = {"sent": 0, "acked": 0, "failed": 0, "txn_sent": 0}
    for txn, ids in facts.txn_sends.items():
        producer = facts.txn_producers.get(txn)
        if producer in per_producer:
            per_producer[producer]["txn_sent"] += len(ids)
    for s in facts.sends.values():
        per_producer.setdefault(s["producer"], {"sent": 0, "acked": 0, "failed": 0})["sent"] += 1
    for a in facts.acks.values():
        per_producer.setdefault(a["producer"], {"sent": 0, "acked": 0, "failed": 0})["acked"] += 1
    for f in facts.fails.values():
        per_producer.setdefault(f["producer"], {"sent": 0, "acked": 0, "failed": 0})["failed"] += 1
    stored_ids = {e["id"] for e in facts.final.values()}
    return {
        "sent": len(facts.sends),
        "acknowledged": len(facts.acks),
        "failed": len(facts.fails),
        "unacknowledged_but_stored": len(stored_ids - set(facts.acks)),
        "failed_but_stored": len(stored_ids & set(facts.fails)),
        "consumer_reads": len(facts.reads),
        "offset_commits": len(facts.commits),
        "final_records": len(facts.final),
        "per_producer": per_producer,
        "transactions": {outcome: sum(1 for e in facts.txn_outcomes.values()
                                      if e.get("outcome") == outcome)
                         for outcome in ("commit", "abort", "unknown")},
        "txn_final_records": len(facts.txn_final),
        "faults": sum(1 for f in facts.faults if f["phase"] == "start"),
    }
