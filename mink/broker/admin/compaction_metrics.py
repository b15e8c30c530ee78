"""The log cleaner's and the KV tablets' series, read from the node at scrape time (nothing on
the hot path): what this node's compaction passes did (`node.cleaner`,
mink/broker/cluster/compaction.py; Kafka's LogCleaner metrics are max-buffer-utilization,
cleaner-recopy-percent, max-clean-time-secs, max-dirty-percent), the dirty ratio of each
partition whose writer lease it holds, and each KV tablet on this node (`node.tablets`,
mink/broker/cluster/tablets.py). The time of each pass is a histogram fed by the cleaner
(`mink_log_cleaner_pass_seconds`, metrics.py).
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_PARTITION = ["topic", "partition"]


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _topic_name(view, topic_id) -> str | None:
    topic = view.topic_by_id(topic_id)
    return None if topic is None else topic.name


def families(node):
    cleaner = node.cleaner
    yield _counter("mink_log_cleaner_passes", "Compaction passes this node swapped.",
                   cleaner.passes)
    yield _counter("mink_log_cleaner_read_bytes", "Bytes compaction passes read from the "
                   "object store (a pass reads its range twice: map, then clean).",
                   cleaner.bytes_read)
    yield _counter("mink_log_cleaner_input_bytes", "Bytes of the index rows compaction passes "
                   "replaced.", cleaner.bytes_in)
    yield _counter("mink_log_cleaner_written_bytes", "Bytes of the stream objects compaction "
                   "passes wrote and swapped in.", cleaner.bytes_out)
    yield _counter("mink_log_cleaner_objects_written", "Stream objects compaction passes "
                   "wrote and swapped in.", cleaner.objects_written)
    yield _counter("mink_log_cleaner_records_read", "Records in the rows compaction passes "
                   "replaced.", cleaner.records_in)
    yield _counter("mink_log_cleaner_records_dropped", "Records compaction passes dropped "
                   "(superseded, aborted, tombstones and markers past their horizon).",
                   cleaner.records_in - cleaner.records_out)
    yield _counter("mink_log_cleaner_tombstones_dropped", "Tombstones dropped after their "
                   "delete horizon (KIP-534).", cleaner.tombstones_dropped)
    yield _counter("mink_log_cleaner_map_full_passes", "Passes that stopped where their "
                   "offset map filled (log_cleaner_dedupe_buffer_size); the next goes on.",
                   cleaner.map_full_passes)
    yield _counter("mink_log_cleaner_failures", "Passes that failed (object store or "
                   "metadata errors, undecodable data); retried at the next round.",
                   cleaner.failures)
    refused = CounterMetricFamily("mink_log_cleaner_refused", "Passes refused at their begin "
                                  "or swap, per reason (stale_writer_lease_epoch, "
                                  "index_changed, unknown_upload, unknown_partition).",
                                  labels=["reason"])
    for reason, count in sorted(cleaner.refused.items()):
        refused.add_metric([reason], count)
    yield refused
    view = node.view
    ratios = GaugeMetricFamily("mink_log_cleaner_dirty_ratio", "Dirty bytes / cleanable "
                               "bytes of each compacted partition whose writer lease this "
                               "node holds, when the cleaner last planned a pass of it (before that pass; a pass "
                               "is due from min.cleanable.dirty.ratio).", labels=_PARTITION)
    for (topic_id, partition), ratio in sorted(cleaner.dirty_ratios.items(),
                                               key=lambda item: (str(item[0][0]), item[0][1])):
        name = _topic_name(view, topic_id)
        if name is not None:
            ratios.add_metric([name, str(partition)], ratio)
    yield ratios
    yield from _tablets(node, view)


def _tablets(node, view):
    keys = GaugeMetricFamily("mink_kv_tablet_keys", "Keys in each KV tablet on this node "
                             "(deleted ones included until compaction drops them).",
                             labels=_PARTITION)
    size = GaugeMetricFamily("mink_kv_tablet_bytes", "Bytes of each KV tablet's table.",
                             labels=_PARTITION)
    lag = GaugeMetricFamily("mink_kv_tablet_lag_offsets", "Offsets committed to the partition "
                            "that its KV tablet has not applied yet.", labels=_PARTITION)
    caught_up = GaugeMetricFamily("mink_kv_tablet_caught_up", "1 once the KV tablet has "
                                  "restored and replayed to the committed end (lookups are "
                                  "answered), else 0.", labels=_PARTITION)
    restore = GaugeMetricFamily("mink_kv_tablet_restore_seconds", "Seconds from the start "
                                "of the KV tablet's restore (snapshot + replay) to caught "
                                "up; so far while it restores.", labels=_PARTITION)
    snapshots = CounterMetricFamily("mink_kv_tablet_snapshots", "KV tablet snapshots this "
                                    "node stored, per partition, since it began leading it.",
                                    labels=_PARTITION)
    now = _now()
    for (topic_id, partition), entry in sorted(node.tablets.tablets.items(),
                                               key=lambda item: (str(item[0][0]), item[0][1])):
        name = _topic_name(view, topic_id)
        tablet = entry.tablet
        if name is None or tablet is None:
            continue
        labels = [name, str(partition)]
        keys.add_metric(labels, len(tablet))
        size.add_metric(labels, tablet.nbytes())
        lag.add_metric(labels, max(0, entry.partition_log.committed_end - tablet.next_offset))
        caught_up.add_metric(labels, 1 if entry.caught_up.is_set() else 0)
        if entry.restore_seconds is not None:
            restore.add_metric(labels, entry.restore_seconds)
        elif entry.started_at is not None and now is not None:
            restore.add_metric(labels, now - entry.started_at)
        snapshots.add_metric(labels, entry.snapshots)
    yield from (keys, size, lag, caught_up, restore, snapshots)


def _now() -> float | None:
    import trio

    try:
        return trio.current_time()
    except RuntimeError:  # scraped from outside the node's trio thread
        return None


__all__ = ["families"]
