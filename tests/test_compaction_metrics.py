"""The log cleaner's and the KV tablets' series on a node's /metrics
(mink/broker/admin/compaction_metrics.py): a producer overwrites keys of a compacted topic;
after a pass the cleaner's counters, its pass histogram and the partition's dirty ratio are
there, and the tablet's keys, lag, caught-up flag and restore time."""

from __future__ import annotations

import trio

from mink.storage.embedded_postgres import free_port
from tests.support.nodes import node_config, start_node
from tests.test_admin import scrape, value, wait_for_metric
from tests.test_compaction import FAST, _produce
from tests.test_lifecycle import create_topic

KEYS, ROUNDS = 500, 3


async def test_cleaner_and_tablet_metrics(pg_url, store_url, nursery):
    port = free_port()
    address = await start_node(nursery, node_config(
        pg_url, store_url, admin_listener=f"127.0.0.1:{port}", **FAST))
    base = f"http://127.0.0.1:{port}"
    await trio.to_thread.run_sync(lambda: create_topic(
        address, "metered-table", 1, cleanup_policy="compact",
        min_cleanable_dirty_ratio="0.01", min_compaction_lag_ms=0))
    items = [(b"key-%04d" % k, b"value-%d" % r) for r in range(ROUNDS) for k in range(KEYS)]
    items.append((b"sentinel", b"last"))
    await trio.to_thread.run_sync(_produce, address, "metered-table", items)
    labels = dict(topic="metered-table", partition="0")

    samples = await wait_for_metric(
        base, lambda s: value(s, "mink_log_cleaner_passes_total") >= 1
        and value(s, "mink_kv_tablet_caught_up", **labels) == 1
        and value(s, "mink_kv_tablet_lag_offsets", **labels) == 0
        and value(s, "mink_kv_tablet_keys", **labels) == KEYS + 1, 60,
        "a pass swapped and the tablet caught up")
    assert value(samples, "mink_log_cleaner_pass_seconds_count") >= 1
    assert value(samples, "mink_log_cleaner_pass_seconds_sum") > 0
    read = value(samples, "mink_log_cleaner_read_bytes_total")
    assert read >= value(samples, "mink_log_cleaner_input_bytes_total") > 0
    assert 0 < value(samples, "mink_log_cleaner_written_bytes_total") < \
        value(samples, "mink_log_cleaner_input_bytes_total")
    assert value(samples, "mink_log_cleaner_objects_written_total") >= 1
    dropped = value(samples, "mink_log_cleaner_records_dropped_total")
    assert 0 < dropped <= (ROUNDS - 1) * KEYS
    assert value(samples, "mink_log_cleaner_records_read_total") >= dropped
    assert value(samples, "mink_log_cleaner_map_full_passes_total") == 0
    assert value(samples, "mink_log_cleaner_failures_total") == 0
    assert ("mink_log_cleaner_dirty_ratio", tuple(sorted(labels.items()))) in samples
    assert 0 <= value(samples, "mink_log_cleaner_dirty_ratio", **labels) <= 1
    assert value(samples, "mink_kv_tablet_bytes", **labels) >= 16 * (KEYS + 1)
    assert value(samples, "mink_kv_tablet_restore_seconds", **labels) > 0

    # Once every record is cleaned, what the passes dropped is what was superseded, and the
    # cleaner's next look finds nothing dirty.
    await wait_for_metric(
        base, lambda s: value(s, "mink_log_cleaner_records_dropped_total")
        == (ROUNDS - 1) * KEYS and s.get(("mink_log_cleaner_dirty_ratio",
                                          tuple(sorted(labels.items())))) == 0, 60,
        "every superseded record dropped, nothing dirty")
    assert (await scrape(base))[("mink_log_cleaner_passes_total", ())] >= 1
