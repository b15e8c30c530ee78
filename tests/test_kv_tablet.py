"""The KV tablet's table (mink/storage/compaction/tablet.py): latest offset and tombstone
per key, committed data only, snapshots restored and replayed to the same table, and within
about 40 bytes per key."""

from __future__ import annotations

import random

import pytest

from mink.protocol.records import Record, build_batch
from mink.storage.compaction.tablet import Entry, KVTablet, TabletError

NOW = 1_700_000_000_000


def batch(base: int, items, **kw) -> bytes:
    return build_batch([Record(i, 0, k, v) for i, (k, v) in enumerate(items)],
                       base_offset=base, base_timestamp=NOW, **kw)


def marker(base: int, commit: bool, producer_id: int) -> bytes:
    return build_batch([Record(0, 0, b"\x00\x00\x00" + (b"\x01" if commit else b"\x00"),
                               b"\x00" * 6)], base_offset=base, producer_id=producer_id,
                       producer_epoch=0, is_transactional=True, is_control=True,
                       base_timestamp=NOW)


def test_latest_offset_and_tombstone_per_key_against_a_dict():
    rng = random.Random(3)
    tablet, reference = KVTablet(), {}
    offset = 0
    for _ in range(300):
        items = [(b"k%d" % rng.randrange(2000), None if rng.random() < 0.1 else b"v")
                 for _ in range(rng.randint(1, 20))]
        tablet.apply(batch(offset, items))
        for i, (k, v) in enumerate(items):
            reference[k] = Entry(offset + i, v is None)
        offset += len(items)
    assert tablet.next_offset == offset
    assert len(tablet) == len(reference)
    assert all(tablet.get(k) == e for k, e in reference.items())
    assert tablet.get(b"never") is None


def test_transactions_reach_the_tablet_when_committed_only():
    tablet = KVTablet()
    txn = dict(producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True)
    tablet.apply(batch(0, [(b"a", b"plain")]))
    tablet.apply(batch(1, [(b"a", b"aborted")], **txn))
    assert tablet.get(b"a") == Entry(0, False)  # not decided yet
    tablet.apply(marker(2, commit=False, producer_id=5))
    assert tablet.get(b"a") == Entry(0, False)
    tablet.apply(batch(3, [(b"a", b"committed"), (b"b", None)], **txn))
    tablet.apply(marker(5, commit=True, producer_id=5))
    assert tablet.get(b"a") == Entry(3, False) and tablet.get(b"b") == Entry(4, True)


def test_snapshot_then_replay_gives_the_same_table():
    rng = random.Random(4)
    log, offset = [], 0
    for _ in range(200):
        items = [(b"k%d" % rng.randrange(5000), b"v") for _ in range(rng.randint(1, 30))]
        log.append(batch(offset, items))
        offset += len(items)
    full = KVTablet()
    for b in log:
        full.apply(b)
    half = KVTablet()
    for b in log[:120]:
        half.apply(b)
    restored = KVTablet.restore(b"".join(half.snapshot()))
    assert restored.next_offset == half.next_offset
    for b in log:  # replay from the start: what the snapshot covers is skipped
        restored.apply(b)
    assert [full.get(b"k%d" % k) for k in range(5000)] == \
        [restored.get(b"k%d" % k) for k in range(5000)]


def test_a_snapshot_with_an_open_transaction_replays_from_its_start():
    tablet = KVTablet()
    txn = dict(producer_id=9, producer_epoch=0, base_sequence=0, is_transactional=True)
    log = [batch(0, [(b"a", b"1")]), batch(1, [(b"t", b"in-txn")], **txn),
           batch(2, [(b"a", b"2")]), marker(3, commit=True, producer_id=9)]
    for b in log[:3]:
        tablet.apply(b)
    restored = KVTablet.restore(b"".join(tablet.snapshot()))
    assert restored.next_offset == 1  # the open transaction's first offset
    for b in log:
        restored.apply(b)
    assert restored.get(b"t") == Entry(1, False) and restored.get(b"a") == Entry(2, False)


@pytest.mark.parametrize("bad", [b"", b"MKVT", b"XXXX" + bytes(60)])
def test_garbage_is_not_a_snapshot(bad):
    with pytest.raises(TabletError):
        KVTablet.restore(bad)


def test_about_forty_bytes_per_key():
    tablet = KVTablet()
    n = 200_000
    for i in range(n):
        tablet.put(b"key-%d" % i, i)
    assert len(tablet) == n
    assert tablet.nbytes() / n <= 45, tablet.nbytes() / n
    assert tablet.get(b"key-123") == Entry(123, False)
