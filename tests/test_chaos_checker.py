"""The campaign's checker on hand-written histories: each injected anomaly is reported as its
class, and a clean history reports nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from chaos.checker import REPORTED, SAFETY, check, safety_failures
from chaos.history import read_history, write_history

Events = list[dict[str, Any]]


def clean_history() -> Events:
    """Two producers (one idempotent), two partitions of 4 records, one consumer reading and
    committing everything, a complete final read, PostgreSQL's epochs and writers."""
    events: Events = [
        {"t": 0.0, "type": "run", "seed": 1, "stall_bound": 13.5},
        {"t": 0.0, "type": "producer", "producer": "idem-0", "client": "confluent",
         "idempotent": True, "acks": "all"},
        {"t": 0.0, "type": "producer", "producer": "plain-0", "client": "confluent",
         "idempotent": False, "acks": "all"},
    ]
    t = 1.0
    layout = {  # partition -> [(producer, seq)] in offset order
        0: [("idem-0", 0), ("idem-0", 1), ("plain-0", 0), ("idem-0", 2)],
        1: [("plain-0", 1), ("idem-0", 3), ("idem-0", 4), ("plain-0", 2)],
    }
    for partition, entries in layout.items():
        for offset, (producer, seq) in enumerate(entries):
            message_id = f"{producer}-{seq}"
            events.append({"t": t, "type": "send", "producer": producer, "id": message_id,
                           "seq": seq})
            events.append({"t": t + 0.01, "type": "ack", "producer": producer, "id": message_id,
                           "partition": partition, "offset": offset})
            events.append({"t": t + 0.5, "type": "read", "consumer": "c-0",
                           "partition": partition, "offset": offset, "id": message_id})
            t += 1.0
    events.sort(key=lambda e: e["t"])
    events += [
        {"t": 9.0, "type": "commit", "consumer": "c-0", "partition": 0, "offset": 2, "sent": 8.9},
        {"t": 9.5, "type": "commit", "consumer": "c-0", "partition": 0, "offset": 4, "sent": 9.4},
        {"t": 9.6, "type": "commit", "consumer": "c-0", "partition": 1, "offset": 4, "sent": 9.5},
        {"t": 10.0, "type": "consumers_stopped"},
        {"t": 10.0, "type": "watermark", "partition": 0, "low": 0, "high": 4},
        {"t": 10.0, "type": "watermark", "partition": 1, "low": 0, "high": 4},
    ]
    # partition 0: leader epoch 0 by node 1 (offsets 0-1), epoch 1 by node 2 from offset 2
    epochs_of = {0: [0, 0, 1, 1], 1: [0, 0, 0, 0]}
    for partition, entries in layout.items():
        for offset, (producer, seq) in enumerate(entries):
            events.append({"t": 10.1, "type": "final", "partition": partition, "offset": offset,
                           "id": f"{producer}-{seq}",
                           "leader_epoch": epochs_of[partition][offset]})
    events += [
        {"t": 10.2, "type": "final_done", "complete": True, "missing": []},
        {"t": 10.3, "type": "pg_epochs", "partition": 0, "epochs": [[0, 0], [1, 2]]},
        {"t": 10.3, "type": "pg_epochs", "partition": 1, "epochs": [[0, 0]]},
        {"t": 10.3, "type": "pg_range", "partition": 0, "base": 0, "last": 1, "node": 1,
         "node_epoch": 3, "key": "wal/1/3/000000000001"},
        {"t": 10.3, "type": "pg_range", "partition": 0, "base": 2, "last": 3, "node": 2,
         "node_epoch": 5, "key": "wal/2/5/000000000001"},
        {"t": 10.3, "type": "pg_range", "partition": 1, "base": 0, "last": 1, "node": 1,
         "node_epoch": 3, "key": "wal/1/3/000000000001"},
        # a restart of node 1 within the same leader epoch: a newer node epoch, allowed
        {"t": 10.3, "type": "pg_range", "partition": 1, "base": 2, "last": 3, "node": 1,
         "node_epoch": 4, "key": "wal/1/4/000000000001"},
        {"t": 10.4, "type": "end"},
    ]
    return events


def only(anomalies: dict[str, list], *names: str) -> dict[str, int]:
    """The classes with anomalies, with their counts (for readable assertion failures)."""
    return {name: len(items) for name, items in anomalies.items() if items}


def final(events: Events, partition: int, offset: int) -> dict[str, Any]:
    return next(e for e in events if e["type"] == "final" and e["partition"] == partition
                and e["offset"] == offset)


def test_a_clean_history_reports_nothing(tmp_path):
    path = tmp_path / "history.jsonl"
    write_history(path, clean_history())
    anomalies = check(read_history(path))
    assert only(anomalies) == {}
    assert safety_failures(anomalies) == 0
    assert set(anomalies) == set(SAFETY) | set(REPORTED)


def test_lost_acknowledged_write():
    events = clean_history()
    # offset 3 of partition 0 holds another value in the final read: idem-0-2 is gone
    final(events, 0, 3)["id"] = "plain-0-9"
    anomalies = check(events)
    assert [(a["id"], a["partition"], a["offset"]) for a in anomalies["lost"]] == [("idem-0-2", 0, 3)]
    assert anomalies["lost"][0]["final_at_offset"] == "plain-0-9"
    # the consumer had read idem-0-2 there: the offset has two values
    assert [(a["partition"], a["offset"]) for a in anomalies["offset_conflict"]] == [(0, 3)]
    assert safety_failures(anomalies) > 0


def test_wrong_offset_in_the_acknowledgement():
    events = clean_history()
    ack = next(e for e in events if e["type"] == "ack" and e["id"] == "idem-0-1")
    ack["offset"] = 7
    anomalies = check(events)
    assert [(a["id"], a["acked"], a["stored"]) for a in anomalies["wrong_offset"]] == [
        ("idem-0-1", [0, 7], [[0, 1]])]


def append_final_copy(events: Events, message_id: str, partition: int, offset: int) -> None:
    """The record stored once more at the end of `partition`."""
    for e in events:
        if e["type"] == "watermark" and e["partition"] == partition:
            e["high"] = offset + 1
    at = next(i for i, e in enumerate(events) if e["type"] == "final_done")
    events.insert(at, {"t": 10.1, "type": "final", "partition": partition, "offset": offset,
                       "id": message_id, "leader_epoch": 1 if partition == 0 else 0})


def test_duplicate_of_an_idempotent_producer_fails_a_non_idempotent_one_is_reported():
    events = clean_history()
    append_final_copy(events, "idem-0-0", 0, 4)
    append_final_copy(events, "plain-0-1", 1, 4)
    anomalies = check(events)
    assert [(a["id"], a["stored"]) for a in anomalies["duplicate"]] == [("idem-0-0", [[0, 0], [0, 4]])]
    assert [a["id"] for a in anomalies["duplicate_non_idempotent"]] == ["plain-0-1"]
    assert only(anomalies) == {"duplicate": 1, "duplicate_non_idempotent": 1}


def test_reorder_within_a_partition():
    events = clean_history()
    # idem-0-3 and idem-0-4 (sent in that order) stored the other way round in partition 1
    for e in events:
        if e.get("id") == "idem-0-3" and "offset" in e:
            e["offset"] = 2
        elif e.get("id") == "idem-0-4" and "offset" in e:
            e["offset"] = 1
    anomalies = check(events)
    [reorder] = anomalies["reorder"]
    assert reorder["partition"] == 1
    assert reorder["earlier_sent"] == {"id": "idem-0-3", "seq": 3, "offset": 2}
    assert reorder["later_sent"] == {"id": "idem-0-4", "seq": 4, "offset": 1}
    assert only(anomalies) == {"reorder": 1}


def test_reorder_of_a_non_idempotent_producer_is_only_reported():
    events = clean_history()
    for e in events:
        if e.get("id") == "plain-0-1" and "offset" in e:
            e["offset"] = 3
        elif e.get("id") == "plain-0-2" and "offset" in e:
            e["offset"] = 0
    anomalies = check(events)
    assert only(anomalies) == {"reorder_non_idempotent": 1}
    assert safety_failures(anomalies) == 0


def test_hole_below_the_high_watermark():
    events = clean_history()
    events.remove(final(events, 1, 2))
    anomalies = check(events)
    assert anomalies["hole"] == [{"partition": 1, "from": 2, "to": 2, "high_watermark": 4}]
    assert [a["id"] for a in anomalies["lost"]] == ["idem-0-4"]


def test_incomplete_final_read_fails():
    events = clean_history()
    next(e for e in events if e["type"] == "final_done").update(complete=False, missing=[1])
    assert only(check(events)) == {"final_read_incomplete": 1}


def test_ack_from_a_fenced_leader_by_leader_epoch():
    events = clean_history()
    # offset 3 of partition 0 carries leader epoch 0, but epoch 1 started at offset 2
    final(events, 0, 3)["leader_epoch"] = 0
    anomalies = check(events)
    [fenced] = [a for a in anomalies["fenced_ack"] if "offset" in a]
    assert (fenced["partition"], fenced["offset"], fenced["id"]) == (0, 3, "idem-0-2")
    assert fenced["acknowledged"] is True
    assert "leader epoch 1 started" in fenced["reason"]


def test_ack_from_a_fenced_node_epoch():
    events = clean_history()
    # partition 1, leader epoch 0: node 1 epoch 4 wrote offsets 2-3; now epoch 3 writes after it
    at = next(i for i, e in enumerate(events) if e["type"] == "end")
    events.insert(at, {"t": 10.3, "type": "pg_range", "partition": 1, "base": 4, "last": 4,
                       "node": 1, "node_epoch": 3, "key": "wal/1/3/000000000002"})
    append_final_copy(events, "plain-0-7", 1, 4)
    events.insert(at, {"t": 5.0, "type": "ack", "producer": "plain-0", "id": "plain-0-7",
                       "partition": 1, "offset": 4})
    events.insert(at, {"t": 4.9, "type": "send", "producer": "plain-0", "id": "plain-0-7",
                       "seq": 7})
    anomalies = check(events)
    [fenced] = anomalies["fenced_ack"]
    assert fenced["offsets"] == [4, 4] and fenced["acknowledged_ids"] == ["plain-0-7"]
    assert "epoch 3 wrote after its epoch 4" in fenced["reason"]


def test_epoch_not_in_the_leader_epoch_cache_is_fenced():
    events = clean_history()
    final(events, 1, 3)["leader_epoch"] = 7
    anomalies = check(events)
    assert any(a.get("offset") == 3 and a["partition"] == 1 for a in anomalies["fenced_ack"])


def test_committed_offset_going_backwards():
    events = clean_history()
    events.append({"t": 12.0, "type": "commit", "consumer": "c-1", "partition": 0, "offset": 1,
                   "sent": 11.0})
    # a commit sent before the higher one completed is concurrent with it: not backwards
    events.append({"t": 12.0, "type": "commit", "consumer": "c-1", "partition": 1, "offset": 3,
                   "sent": 9.55})
    anomalies = check(events)
    assert [(a["partition"], a["offset"], a["earlier_offset"]) for a in anomalies["commit_backwards"]] == [(0, 1, 4)]
    assert only(anomalies) == {"commit_backwards": 1}


def test_stalled_partition_is_reported_not_failed():
    events = clean_history()
    events = copy.deepcopy(events)
    # 40 s without reads of partition 1 while an acknowledged record waited there
    for e in events:
        if e["type"] == "consumers_stopped":
            e["t"] = 60.0
    at = next(i for i, e in enumerate(events) if e["type"] == "consumers_stopped")
    events.insert(at, {"t": 15.0, "type": "send", "producer": "plain-0", "id": "plain-0-8",
                       "seq": 8})
    events.insert(at, {"t": 15.1, "type": "ack", "producer": "plain-0", "id": "plain-0-8",
                       "partition": 1, "offset": 4})
    events.insert(at, {"t": 55.0, "type": "read", "consumer": "c-0", "partition": 1,
                       "offset": 4, "id": "plain-0-8"})
    append_final_copy(events, "plain-0-8", 1, 4)
    anomalies = check(events)
    [stall] = anomalies["stalled_partition"]
    assert stall["partition"] == 1 and stall["seconds"] > 40
    assert safety_failures(anomalies) == 0


@pytest.mark.parametrize("last_fault_ends, stalled", [(53.0, False), (30.0, True)])
def test_a_stall_is_counted_from_the_end_of_the_faults_in_it(last_fault_ends, stalled):
    """Faults one after the other keep partition 1 unread from t=15 to t=55: liveness is
    asked once they are over, so the gap counts from the end of the last fault in it (2 s
    later: no stall; 25 s later: a stall, with the part after the faults given)."""
    events = copy.deepcopy(clean_history())
    for e in events:
        if e["type"] == "consumers_stopped":
            e["t"] = 60.0
    at = next(i for i, e in enumerate(events) if e["type"] == "consumers_stopped")
    events[at:at] = [
        {"t": 15.0, "type": "send", "producer": "plain-0", "id": "plain-0-8", "seq": 8},
        {"t": 15.1, "type": "ack", "producer": "plain-0", "id": "plain-0-8", "partition": 1,
         "offset": 4},
        *[{"t": t, "type": "fault", "fault": "kill", "phase": phase, "detail": {"node": 1}}
          for start in (16.0, 24.0) for t, phase in ((start, "start"), (start + 6, "end"))],
        {"t": last_fault_ends - 6, "type": "fault", "fault": "pause", "phase": "start",
         "detail": {"node": 2}},
        {"t": last_fault_ends, "type": "fault", "fault": "pause", "phase": "end",
         "detail": {"node": 2}},
        {"t": 55.0, "type": "read", "consumer": "c-0", "partition": 1, "offset": 4,
         "id": "plain-0-8"},
    ]
    events.sort(key=lambda e: e["t"])
    append_final_copy(events, "plain-0-8", 1, 4)
    stalls = check(events)["stalled_partition"]
    if stalled:
        [stall] = stalls
        assert stall["seconds"] > 39 and stall["after_faults"] == pytest.approx(25.0)
    else:
        assert stalls == []


@pytest.mark.parametrize("partition, offset", [(0, 0), (1, 3)])
def test_read_absent_from_the_final_log(partition, offset):
    events = clean_history()
    events.append({"t": 9.9, "type": "read", "consumer": "c-1", "partition": partition,
                   "offset": offset + 10, "id": "ghost"})
    anomalies = check(events)
    assert [(a["partition"], a["offset"]) for a in anomalies["offset_conflict"]] == [
        (partition, offset + 10)]


def test_stalled_producer_is_reported_not_failed():
    events = clean_history()
    at = next(i for i, e in enumerate(events) if e["type"] == "consumers_stopped")
    # plain-0 sends on from t=9 to t=40 and nothing is acknowledged
    events[at:at] = [{"t": 9.0 + i, "type": "send", "producer": "plain-0",
                      "id": f"plain-0-{10 + i}", "seq": 10 + i} for i in range(32)]
    anomalies = check(events)
    [stall] = anomalies["stalled_producer"]
    assert stall["producer"] == "plain-0" and stall["seconds"] > 30
    assert safety_failures(anomalies) == 0


def test_an_acknowledgement_without_an_offset_is_checked_for_loss_only():
    """librdkafka acknowledges messages whose request timed out without an offset when a
    later batch in sequence proves them written (seed 615 had 25): no crash, no false
    reorder or wrong offset, but loss is still caught."""
    events = clean_history()
    for e in events:
        if e["type"] == "ack" and e["id"] in ("idem-0-1", "idem-0-2"):
            e["offset"] = None
    assert only(check(events)) == {}
    final(events, 0, 3)["id"] = "plain-0-9"  # idem-0-2, acknowledged without offset, is gone
    lost = check(events)["lost"]
    assert [(a["id"], a["partition"], a["offset"]) for a in lost] == [("idem-0-2", 0, None)]


def with_transactions(outcomes: dict[str, str], stored: dict[str, list[int]]) -> Events:
    """clean_history plus the transactional topic: transactions of three messages with the
    given outcomes; `stored` says which of each transaction's messages the read_committed
    final read holds (by index), each at its own offset of partition 0."""
    events = [e for e in clean_history() if e["type"] != "end"]
    offset = 0
    for txn, outcome in outcomes.items():
        ids = [f"{txn}-{i}" for i in range(3)]
        events.append({"t": 11.0, "type": "txn_begin", "producer": "txn.0", "txn": txn})
        events += [{"t": 11.0, "type": "txn_send", "producer": "txn.0", "txn": txn, "id": i}
                   for i in ids]
        if outcome != "never-ended":
            events.append({"t": 11.1, "type": "txn_end", "producer": "txn.0", "txn": txn,
                           "outcome": outcome, "error": None})
        for i in stored.get(txn, []):
            events.append({"t": 12.0, "type": "txn_final", "partition": 0, "offset": offset,
                           "id": ids[i], "leader_epoch": 0})
            offset += 2  # a marker after each
    events += [{"t": 12.5, "type": "txn_final_done", "complete": True, "missing": []},
               {"t": 13.0, "type": "end"}]
    return events


def test_transactions_whole_or_not_at_all_report_nothing():
    events = with_transactions({"t0": "commit", "t1": "abort", "t2": "unknown",
                                "t3": "unknown", "t4": "never-ended"},
                               {"t0": [0, 1, 2], "t2": [0, 1, 2]})
    assert only(check(events)) == {}


def test_a_committed_transaction_seen_in_part_fails():
    events = with_transactions({"t0": "commit", "t1": "commit"}, {"t0": [0, 1, 2], "t1": [0, 2]})
    anomalies = check(events)
    assert only(anomalies) == {"txn_partial": 1}
    assert anomalies["txn_partial"][0]["missing"] == ["t1-1"]


def test_an_undecided_transaction_seen_in_part_fails():
    events = with_transactions({"t0": "unknown", "t1": "never-ended"}, {"t0": [1], "t1": [0, 1]})
    assert only(check(events)) == {"txn_partial": 2}


def test_aborted_data_seen_by_read_committed_fails():
    events = with_transactions({"t0": "abort"}, {"t0": [2]})
    anomalies = check(events)
    assert only(anomalies) == {"txn_aborted_visible": 1}
    assert anomalies["txn_aborted_visible"][0]["seen"] == ["t0-2"]


def test_a_transactional_message_stored_twice_fails():
    events = with_transactions({"t0": "commit"}, {"t0": [0, 1, 2]})
    again = next(e for e in events if e["type"] == "txn_final" and e["id"] == "t0-1")
    events.insert(events.index(again) + 1, {**again, "offset": 99})
    assert only(check(events)) == {"txn_duplicate": 1}


def test_an_incomplete_read_of_the_transactional_topic_fails():
    events = with_transactions({"t0": "commit"}, {"t0": [0, 1, 2]})
    done = next(e for e in events if e["type"] == "txn_final_done")
    done.update(complete=False, missing=[1])
    assert only(check(events)) == {"final_read_incomplete": 1}


def test_the_summary_counts_a_transactional_producers_messages_per_transaction():
    """The report's producer table once showed the transactional producer as 0 sent: its
    messages are txn_send events, counted with the outcomes of their transactions."""
    from chaos.checker import Facts, summary

    events = with_transactions({"t0": "commit", "t1": "abort", "t2": "unknown"},
                               {"t0": [0, 1, 2]})
    events.insert(0, {"t": 0.0, "type": "producer", "producer": "txn.0",
                      "client": "confluent-kafka", "idempotent": True, "transactional": True})
    totals = summary(Facts.from_events(events))
    assert totals["per_producer"]["txn.0"]["txn_sent"] == 9
    assert totals["transactions"] == {"commit": 1, "abort": 1, "unknown": 1}
    assert totals["txn_final_records"] == 3
