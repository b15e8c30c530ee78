"""Safety under PostgreSQL faults (issue 11): each test drives a real fault (a TCP proxy between
the node and PostgreSQL that stalls, cuts or drops replies; PostgreSQL stopped) and checks
the promise the fault used to break."""

from __future__ import annotations

from types import SimpleNamespace

import psycopg
import pytest
import trio

from mink.client import KafkaClient
from mink.broker.cluster.coordinator import ClusterCoordinator
from mink.broker.cluster.sync import view_from_snapshot
from mink.storage.controlplane import MetadataStore, StaleEpoch
from mink.testing.proxy import TcpProxy
from tests.support.postgres import via_proxy


@pytest.fixture
async def direct_store(pg_url, aio_loop):
    store = await MetadataStore.open(pg_url, timeout=2.0, op_timeout=10.0)
    yield store
    with trio.CancelScope(shield=True):
        await store.aclose()


# -- 1. A deposed coordinator moves nothing --------------------------------------------------

async def test_a_coordinator_action_without_an_epoch_is_refused(direct_store):
    store = direct_store
    epoch = await store.register_node(1, "127.0.0.1", 9001, ttl_s=30)
    lease = await store.acquire_lease("coordinator", 1, epoch, ttl_s=30)
    topic = await store.create_topic("t", 1, {}, [1], coordinator_epoch=lease)
    for action in (lambda: store.lead_partitions([(topic.topic_id, 0, 1, 0)], None),
                   lambda: store.lead_partition(topic.topic_id, 0, 1, None),
                   lambda: store.create_topic("u", 1, {}, [1], coordinator_epoch=None),
                   lambda: store.create_partitions("t", 2, [1], coordinator_epoch=None),
                   lambda: store.delete_topic("t", coordinator_epoch=None)):
        with pytest.raises(StaleEpoch) as refused:
            await action()
        assert refused.value.reason == "missing_coordinator_epoch"
    [view_topic] = (await store.view()).topics
    assert [(p.leader_node, p.leader_epoch) for p in view_topic.partitions] == [(1, 0)]


async def test_restart_path_re_leads_its_own_partition_fenced_by_its_node_epoch(direct_store):
    from mink.storage.controlplane import LeaderMoved

    store = direct_store
    e1 = await store.register_node(1, "127.0.0.1", 9001, ttl_s=30)
    await store.register_node(2, "127.0.0.1", 9002, ttl_s=30)
    lease = await store.acquire_lease("coordinator", 1, e1, ttl_s=30)
    topic = await store.create_topic("t", 2, {}, [1, 2], coordinator_epoch=lease)
    assert await store.relead_own_partition(topic.topic_id, 0, 1, e1,
                                            expected_leader_epoch=0) == 1
    with pytest.raises(StaleEpoch) as refused:  # the expected epoch moved on
        await store.relead_own_partition(topic.topic_id, 0, 1, e1, expected_leader_epoch=0)
    assert refused.value.reason == "leader_epoch_changed"
    with pytest.raises(LeaderMoved):  # not its partition
        await store.relead_own_partition(topic.topic_id, 1, 1, e1, expected_leader_epoch=0)
    e1b = await store.register_node(1, "127.0.0.1", 9001, ttl_s=30)
    with pytest.raises(StaleEpoch) as refused:  # an earlier incarnation of node 1
        await store.relead_own_partition(topic.topic_id, 0, 1, e1, expected_leader_epoch=1)
    assert refused.value.reason == "stale_node_epoch"
    assert await store.relead_own_partition(topic.topic_id, 0, 1, e1b,
                                            expected_leader_epoch=1) == 2


class _Sync(SimpleNamespace):
    async def refresh_view(self) -> None:
        pass


async def test_a_coordinator_deposed_while_its_tick_awaits_moves_nothing(pg_url, aio_loop,
                                                                         pg_proxy, nursery):
    """The tick reads the view through a stalled connection; meanwhile the node stops leading
    (stop_leading -> coordinator.drop()); when PostgreSQL answers, no move may be made."""
    store = await MetadataStore.open(via_proxy(pg_url, pg_proxy), timeout=5.0, op_timeout=30.0)
    try:
        e1 = await store.register_node(1, "127.0.0.1", 9001, ttl_s=30)
        e2 = await store.register_node(2, "127.0.0.1", 9002, ttl_s=30)
        node = SimpleNamespace(metadata=store, objects=None, node_id=1, draining=False,
                               membership=SimpleNamespace(node_epoch=e1, leading=True),
                               sync=_Sync(),
                               config=SimpleNamespace(lease_ttl=30.0, coordinator_tick=0.5))
        coordinator = ClusterCoordinator(node)
        await coordinator.hold_lease()
        assert coordinator.is_holder
        topic = await store.create_topic("orphaned", 2, {}, [2, 2],
                                         coordinator_epoch=coordinator.lease_epoch)
        await store.leave(2, e2)  # node 2 is gone: both partitions are orphans
        # the node's own view shows them (the tick then reads the whole view to plan)
        node.view = view_from_snapshot(await store.view())

        pg_proxy.stall()
        finished = trio.Event()

        async def tick() -> None:
            try:
                await coordinator.tick()
            finally:
                finished.set()

        nursery.start_soon(tick)
        with trio.fail_after(10):  # the tick's view request is held by the proxy
            while pg_proxy.bytes_held_to_upstream == 0:
                await trio.sleep(0.01)
        node.membership.leading = False  # what Membership.stop_leading does
        coordinator.drop()
        pg_proxy.resume()
        with trio.fail_after(20):
            await finished.wait()
        [view_topic] = [t for t in (await store.view()).topics if t.name == "orphaned"]
        assert [(p.leader_node, p.leader_epoch) for p in view_topic.partitions] == [
            (2, 0), (2, 0)], "a deposed coordinator moved partitions"
        assert topic.partitions == 2
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


# -- 5. Self-fencing on time -----------------------------------------------------------------

NOT_LEADER, REQUEST_TIMED_OUT = 6, 7


async def test_with_postgres_stalled_produce_is_refused_by_the_validity_deadline(
        pg_url, pg_proxy, store_url, nursery):
    """Every handler checks the validity deadline (last renewal sent + lease_ttl - margin)
    without awaiting: every Produce sent from lease_ttl - margin + 100 ms after the stall is
    refused, however long the membership loop's PostgreSQL calls hang. (Timed by when each
    was sent, not when its answer came: a loaded machine may answer late, which is no act
    past the deadline; a request the node accepted and let time out would be.)"""
    from mink.protocol.records import Record, build_batch
    from tests.support.nodes import node_config, start_node
    from tests.support.raw import produce_request, produce_result

    ttl = 3.0
    margin = max(0.5, ttl / 10)
    address = await start_node(nursery, node_config(via_proxy(pg_url, pg_proxy), store_url,
                                                    lease_ttl=ttl, coordinator_tick=0.5))
    client = await KafkaClient.connect(address)
    records = build_batch([Record(0, 0, None, b"x")])
    with trio.fail_after(30):  # auto-created, opened, writable
        while produce_result(await client.call(0, 9, produce_request("fence", 0, records)))[0]:
            await trio.sleep(0.05)
    pg_proxy.stall()
    stalled_at = trio.current_time()
    bound = stalled_at + ttl - margin + 0.1
    try:
        answers = []  # (sent, error)
        with trio.fail_after(30):
            while not [e for sent, e in answers if sent >= bound + 0.5]:
                sent = trio.current_time()
                error, _ = produce_result(await client.call(
                    0, 9, produce_request("fence", 0, records, timeout_s=0.02)))
                assert error in (0, NOT_LEADER, REQUEST_TIMED_OUT), error
                answers.append((sent, error))
        refused = [sent for sent, error in answers if error == NOT_LEADER]
        print(f"first refused Produce sent {refused[0] - stalled_at:.3f}s after the stall "
              f"(bound {ttl - margin + 0.1:.1f}s)")
        late = [(round(sent - stalled_at, 3), error) for sent, error in answers
                if sent >= bound and error != NOT_LEADER]
        assert not late, f"acted past the validity deadline: {late}"
    finally:
        pg_proxy.resume()
        await client.aclose()


async def test_an_append_refused_by_a_fence_is_answered_once_the_node_leads_again(
        pg_url, pg_proxy, store_url, nursery):
    """A Produce appended just before the node fenced itself (PostgreSQL cut off past
    lease_ttl) is refused as not written once PostgreSQL answers. With produce forwarding,
    such a refusal waits for the partition's new leader; when the new leader is this node
    again (it registered anew and re-led its partitions), there is no one to wait for: the
    answer comes then (NOT_LEADER_OR_FOLLOWER, the client retries here), not at the
    request's timeout. (Found by the fault campaign: kafka-python, whose request timeout
    equals its produce timeout, gave up on such requests every time and reconnected.)"""
    from mink.protocol.records import Record, build_batch
    from tests.support.nodes import node_config, start_node
    from tests.support.raw import produce_request, produce_result

    ttl = 3.0
    address = await start_node(nursery, node_config(via_proxy(pg_url, pg_proxy), store_url,
                                                    lease_ttl=ttl, coordinator_tick=0.5))
    client = await KafkaClient.connect(address)
    records = build_batch([Record(0, 0, None, b"x")])
    with trio.fail_after(30):  # auto-created, opened, writable
        while produce_result(await client.call(0, 9, produce_request("refenced", 0, records)))[0]:
            await trio.sleep(0.05)
    answered: list[tuple[float, int]] = []

    async def produce() -> None:
        started = trio.current_time()
        error, _ = produce_result(await client.call(
            0, 9, produce_request("refenced", 0, records, timeout_s=20.0)))
        answered.append((trio.current_time() - started, error))

    pg_proxy.cut()  # its commit never arrives; the node fences itself at lease_ttl - margin
    try:
        nursery.start_soon(produce)
        await trio.sleep(ttl + 1.0)
    finally:
        pg_proxy.restore()
    with trio.fail_after(30):
        while not answered:
            await trio.sleep(0.05)
    [(seconds, error)] = answered
    assert error in (0, NOT_LEADER), error
    assert seconds < 12.0, f"answered {seconds:.1f} s after it was sent (timeout 20 s)"
    with trio.fail_after(30):  # and the node takes writes again
        while produce_result(await client.call(0, 9, produce_request("refenced", 0, records)))[0]:
            await trio.sleep(0.05)
    await client.aclose()


async def test_renewals_do_not_queue_behind_a_busy_pool(pg_url, store_url, nursery):
    """Every connection of the node's pool busy for twice lease_ttl (slow statements: a
    catch-up read's index lookups, tiering, commits on a loaded server): the membership's
    renewals go over a connection of their own, so the node keeps leading at the same
    epoch. (A renewal that waited for a pooled connection fenced it.)"""
    import functools

    from mink.broker.node import run_node
    from mink.storage.controlplane.postgres import READ
    from tests.support.nodes import node_config

    ttl = 3.0
    done, started = [], []

    async def hold_a_connection(node) -> None:
        await node.metadata.fetch_one(READ, "SELECT pg_sleep(%s)", (2 * ttl,))
        done.append(1)

    def hog_the_pool(node) -> None:
        # Started from the node's own task: its trio-asyncio loop runs the pool.
        for _ in range(node.metadata.pool_size):
            node.nursery.start_soon(hold_a_connection, node)
        started.append(node)

    await nursery.start(functools.partial(
        run_node, node_config(pg_url, store_url, lease_ttl=ttl, coordinator_tick=0.5),
        freeze_heap=False, on_started=hog_the_pool))
    (node,) = started
    epoch = node.membership.node_epoch
    with trio.fail_after(4 * ttl):
        while len(done) < node.metadata.pool_size:
            assert node.membership.may_lead(), "fenced while its pool was busy"
            await trio.sleep(0.05)
    assert node.membership.node_epoch == epoch


# -- 3. InitProducerId during an outage --------------------------------------------------------

COORDINATOR_NOT_AVAILABLE = 15


async def test_init_producer_id_through_an_outage(pg_url, pg_proxy, store_url, nursery):
    """The next producer-id block is reserved before the current one runs out, so producers
    starting during a PostgreSQL outage still get ids; once both blocks are used up the answer
    is a retriable error within a bounded time, and ids flow again once PostgreSQL is back."""
    from mink.broker.transactions.producer_ids import BLOCK_SIZE
    from tests.support.nodes import node_config, start_node
    from tests.support.raw import init_producer_id_request

    address = await start_node(nursery, node_config(via_proxy(pg_url, pg_proxy), store_url,
                                                    lease_ttl=30.0))
    client = await KafkaClient.connect(address)
    seen: set[int] = set()

    async def init() -> tuple[int, int, float]:
        started = trio.current_time()
        response = await client.call(22, 4, init_producer_id_request())
        return response.error_code, response.producer_id, trio.current_time() - started

    for _ in range(BLOCK_SIZE * 3 // 4):  # past half of the first block
        error, producer_id, _ = await init()
        assert error == 0 and producer_id not in seen
        seen.add(producer_id)
    def reserved() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return conn.execute("SELECT next_producer_id FROM cluster").fetchone()[0]

    first_block = min(seen) // BLOCK_SIZE * BLOCK_SIZE
    with trio.fail_after(10):  # the spare block is reserved in the background
        while await trio.to_thread.run_sync(reserved) < first_block + 2 * BLOCK_SIZE:
            await trio.sleep(0.05)
    pg_proxy.cut()
    try:
        errors = []
        for _ in range(BLOCK_SIZE):  # the rest of the first block and part of the spare one
            error, producer_id, took = await init()
            assert error == 0, f"InitProducerId failed during the outage after {len(seen)} ids"
            assert producer_id not in seen
            seen.add(producer_id)
        for _ in range(BLOCK_SIZE):
            error, producer_id, took = await init()
            if error:
                errors.append((error, took))
                break
            seen.add(producer_id)
        assert errors, "ids kept coming with PostgreSQL unreachable"
        assert errors[0][0] == COORDINATOR_NOT_AVAILABLE  # retriable, never fatal
        assert errors[0][1] < 5.0, f"InitProducerId took {errors[0][1]:.1f}s to answer"
    finally:
        pg_proxy.restore()
    with trio.fail_after(30):
        while True:
            error, producer_id, _ = await init()
            if error == 0:
                break
            assert error == COORDINATOR_NOT_AVAILABLE
            await trio.sleep(0.1)
    assert producer_id not in seen
    await client.aclose()


# -- 2. No duplicates from an idempotent producer when a commit's reply is lost -----------------

def _committed_end(pg_url: str, topic: str) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute("SELECT p.committed_end FROM partitions p JOIN topics t "
                            "USING (topic_id) WHERE t.name = %s AND t.deleted_at IS NULL",
                            (topic,)).fetchone()[0]


def _node_epoch(pg_url: str, node_id: int) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute("SELECT epoch FROM nodes WHERE node_id = %s",
                            (node_id,)).fetchone()[0]


async def test_a_commit_whose_reply_was_lost_is_read_back_across_self_fencing(
        pg_url, pg_proxy, store_url, nursery):
    """PostgreSQL carries out a CommitWal but its reply is lost (the proxy drops every reply);
    the node self-fences and registers again. The waiting Produce is answered with the
    original offset (the outcome read back, not REQUEST_TIMED_OUT), the producer's retry gets
    that same offset, and the batch is stored once."""
    from mink.protocol.records import Record, build_batch
    from tests.support.nodes import node_config, start_node
    from tests.support.raw import (
        init_producer_id_request,
        produce_request,
        produce_result,
    )

    def batch(producer_id: int, sequence: int, value: bytes) -> bytes:
        return build_batch([Record(0, 0, None, value)], producer_id=producer_id,
                           producer_epoch=0, base_sequence=sequence)

    address = await start_node(nursery, node_config(
        via_proxy(pg_url, pg_proxy), store_url, lease_ttl=3.0, coordinator_tick=0.5,
        commit_timeout=1.0))
    client = await KafkaClient.connect(address)
    init = await client.call(22, 4, init_producer_id_request())
    pid = init.producer_id
    with trio.fail_after(30):
        while produce_result(await client.call(0, 9, produce_request(
                "lost-reply", 0, batch(pid, 0, b"first"))))[0]:
            await trio.sleep(0.05)
    assert await trio.to_thread.run_sync(_committed_end, pg_url, "lost-reply") == 1
    epoch_before = await trio.to_thread.run_sync(_node_epoch, pg_url, 1)

    pg_proxy.drop_replies(True)
    request = produce_request("lost-reply", 0, batch(pid, 1, b"second"), timeout_s=60)
    answer: list = []

    async def produce() -> None:
        answer.append(produce_result(await client.call(0, 9, request)))

    nursery.start_soon(produce)
    try:
        with trio.fail_after(20):  # PostgreSQL committed it; the node never heard
            while await trio.to_thread.run_sync(_committed_end, pg_url, "lost-reply") < 2:
                await trio.sleep(0.05)
        await trio.sleep(3.5)  # past lease_ttl: the node self-fences meanwhile
    finally:
        pg_proxy.drop_replies(False)
    with trio.fail_after(30):  # it self-fenced and registers again
        while await trio.to_thread.run_sync(_node_epoch, pg_url, 1) == epoch_before:
            await trio.sleep(0.05)
    with trio.fail_after(40):
        while not answer:
            await trio.sleep(0.05)
    assert answer[0] == (0, 1), f"the waiting Produce was answered {answer[0]}"
    retry = await KafkaClient.connect(address)
    with trio.fail_after(30):
        while True:
            result = produce_result(await retry.call(0, 9, request))
            if result[0] == 0:
                break
            await trio.sleep(0.05)
    assert result == (0, 1), f"the retry was written again at {result[1]}"
    assert await trio.to_thread.run_sync(_committed_end, pg_url, "lost-reply") == 2
    await retry.aclose()
    await client.aclose()


# -- 4. PostgreSQL blips leave leaders and groups in place ---------------------------------------

@pytest.mark.parametrize("gap", [0.3, 0.9])
def test_postgres_blips_leave_leaders_and_groups_in_place(cluster, pg_server, gap):
    """A PostgreSQL restart with the server down `gap` seconds (below lease_ttl / 3) while a
    group consumer commits offsets: no node stops leading, the group keeps its generation and
    its members (OffsetCommit waits at most a third of the session timeout, so heartbeats are
    not held back; the pool reconnects at once). lease_ttl is 6 s here, so that a restart
    that pg_ctl stretches to two seconds on a loaded machine is still below lease_ttl / 3."""
    import threading
    import time

    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    lease_ttl = 6.0
    session_s = 6.0
    for node_id in (1, 2, 3):
        cluster.start(node_id, lease_ttl=lease_ttl)
    cluster.wait_for(lambda: cluster.live_nodes() == {1, 2, 3}, what="three live nodes")
    cluster.wait_for(cluster.coordinator, what="a coordinator")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("blips", 3, 1)], operation_timeout=20)["blips"].result(30)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})

    def produce(n: int) -> None:
        for i in range(n):
            producer.produce("blips", value=b"%d" % i)
        assert producer.flush(60) == 0

    def committed() -> int:
        rows = cluster.query("SELECT coalesce(sum(committed_offset), 0) FROM group_offsets "
                             "WHERE group_id = 'blips-group'")
        return rows[0][0]

    def group() -> tuple[int, list[str]] | None:
        rows = cluster.query("SELECT generation, members FROM consumer_groups "
                             "WHERE group_id = 'blips-group'")
        if not rows or not rows[0][1]:
            return None
        return rows[0][0], sorted(m["member_id"] for m in rows[0][1])

    stop = threading.Event()
    errors: list = []

    def consume() -> None:
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "blips-group",
                             "auto.offset.reset": "earliest", "enable.auto.commit": True,
                             "auto.commit.interval.ms": 100,
                             "session.timeout.ms": int(session_s * 1000),
                             "heartbeat.interval.ms": 500})
        consumer.subscribe(["blips"])
        while not stop.is_set():
            msg = consumer.poll(0.1)
            if msg is not None and msg.error():
                errors.append(msg.error())
        consumer.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        produce(300)
        cluster.wait_for(lambda: committed() == 300, timeout=60, what="the group committing")
        before = cluster.wait_for(group, what="a stable group")
        epochs = {n: cluster.node_epoch(n) for n in (1, 2, 3)}
        leaders = {t: cluster.leaders(t) for t in ("blips", "__consumer_offsets")}

        stopped_at = time.monotonic()
        pg_server.stop("fast")
        time.sleep(gap)
        pg_server.start()
        outage = time.monotonic() - stopped_at
        print(f"PostgreSQL down for {outage:.2f}s (gap {gap}s, lease_ttl {lease_ttl}s)")
        if outage > lease_ttl / 3:
            # pg_ctl took so long (a loaded machine) that this is no longer a blip below
            # lease_ttl / 3, which is what this test is about.
            pytest.skip(f"PostgreSQL was down {outage:.2f}s, not below lease_ttl / 3")
        # Commits land again, and again after a whole session timeout (members that were
        # going to expire have by then).
        produce(300)
        cluster.wait_for(lambda: committed() == 600, timeout=60, what="commits after the blip")
        settled_at = time.monotonic() + session_s + 1
        cluster.wait_for(lambda: time.monotonic() > settled_at, timeout=session_s + 5,
                         what="a session timeout after the blip")
        produce(300)
        cluster.wait_for(lambda: committed() == 900, timeout=60,
                         what="commits a session timeout after the blip")
        assert {n: cluster.node_epoch(n) for n in (1, 2, 3)} == epochs, \
            "a node stopped leading and registered again"
        assert {t: cluster.leaders(t) for t in ("blips", "__consumer_offsets")} == leaders
        assert group() == before, "the group rebalanced (generation or members changed)"
    finally:
        stop.set()
        reader.join(30)


# -- Node identity: one live process per node id -------------------------------------------------

def test_a_duplicate_node_id_is_refused_and_a_restart_after_sigkill_accepted(cluster):
    import time

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    first = cluster.start(1)
    cluster.wait_for(lambda: cluster.live_nodes() == {1}, what="node 1 live")
    admin = AdminClient({"bootstrap.servers": first.address})
    admin.create_topics([NewTopic("ident", 2, 1)], operation_timeout=20)["ident"].result(30)
    cluster.wait_for(lambda: len(cluster.open_streams("ident")) == 2, what="streams open")
    epoch = cluster.node_epoch(1)

    duplicate = cluster.make_process(cluster.config(1))  # same node id, another port
    try:
        duplicate.start()  # it may listen while it tries to register, then exit
    except RuntimeError:
        pass
    cluster.wait_for(lambda: duplicate.process.poll() is not None, timeout=20,
                     what="the duplicate giving up")
    assert duplicate.process.returncode == 2
    refusals = [line for line in duplicate.log_path.read_text().splitlines()
                if "is in use by another live process" in line]
    assert len(refusals) == 1, refusals
    assert cluster.node_epoch(1) == epoch, "the duplicate registered over the live node"
    assert first.process.poll() is None

    first.kill()
    killed_at = time.monotonic()
    cluster.wait_for(lambda: time.monotonic() - killed_at >= 2.0, timeout=5, what="2 s")
    cluster.start(1)  # same id, same port, a new incarnation: accepted
    cluster.wait_for(lambda: cluster.node_epoch(1) > epoch, what="node 1 registered again")
    new_epoch = cluster.node_epoch(1)
    cluster.wait_for(lambda: cluster.query(
        "SELECT count(*) FROM partitions p JOIN topics t USING (topic_id) "
        "WHERE t.name = 'ident' AND p.stream_state = 'open' AND p.opened_by_node = 1 "
        "AND p.opened_by_epoch = %s", new_epoch)[0][0] == 2, what="its partitions taken back")
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for partition in (0, 1):
        producer.produce("ident", value=b"after", partition=partition)
    assert producer.flush(30) == 0


# -- A clean hand-over closes the stream ---------------------------------------------------------

async def test_a_partition_handed_over_is_closed_for_its_next_leader(pg_url, store_url, aio_loop,
                                                                     nursery):
    """When the view moves a partition away, its old leader closes the stream in PostgreSQL,
    so the new leader opens it at once instead of waiting out the HeldBy grace."""
    from mink.protocol.records import Record, build_batch
    from tests.support.metadata import ToolMetadataStore
    from tests.support.nodes import node_config, start_node
    from tests.support.raw import produce_request, produce_result

    address = await start_node(nursery, node_config(pg_url, store_url, lease_ttl=3.0,
                                                    coordinator_tick=0.5))
    client = await KafkaClient.connect(address)
    records = build_batch([Record(0, 0, None, b"x")])
    with trio.fail_after(30):
        while produce_result(await client.call(0, 9, produce_request("handed", 0, records)))[0]:
            await trio.sleep(0.05)
    await client.aclose()
    store = await ToolMetadataStore.open(pg_url)
    try:
        await store.register_node(2, "127.0.0.1", 9002, ttl_s=60)
        topic = await store.get_topic("handed")
        state = await store.stream_state(topic.topic_id, 0)
        assert (state.stream_state, state.opened_by_node) == ("open", 1)
        await store.lead_partition(topic.topic_id, 0, 2)  # a planned move to node 2
        with trio.fail_after(10):
            while (await store.stream_state(topic.topic_id, 0)).stream_state != "closed":
                await trio.sleep(0.05)
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


# -- A commit PostgreSQL rejects is not retried forever -----------------------------------------

async def test_a_commit_rejected_by_postgres_fails_its_appends_and_the_pipeline_goes_on(
        pg_url, aio_loop, nursery):
    """A data exception (here a max timestamp out of bigint range) is not a lost connection:
    the commit is definitely not applied. Its appends fail retriably, the partition rewinds,
    and later commits are not held up behind it."""
    from mink.storage.log import StorageUnavailable
    from mink.storage.objectstore import open_object_store
    from tests.support.metadata import ToolMetadataStore
    from tests.test_wal import Node, append, batch, make_topic

    metadata = await ToolMetadataStore.open(pg_url)
    try:
        objects = open_object_store("memory://")
        topic = await make_topic(metadata, 2, name="rejected")
        streams = await Node(metadata, objects, 1, commit_timeout=2.0).start(nursery)
        bad_log = await streams.open(topic.topic_id, 0, 0)
        good_log = await streams.open(topic.topic_id, 1, 0)
        bad = bad_log.append(batch([b"bad"]), [1], 2**63)  # does not fit PostgreSQL's bigint
        with trio.fail_after(10):
            with pytest.raises(StorageUnavailable):
                await bad.wait()
        assert bad_log.next_offset == bad_log.committed_end == 0
        with trio.fail_after(10):
            assert await append(good_log, [b"good"]).wait() == 0
            assert await append(bad_log, [b"again"]).wait() == 0
    finally:
        with trio.CancelScope(shield=True):
            await metadata.aclose()


async def test_an_object_refused_for_a_stale_node_epoch_is_queued_for_deletion(
        pg_url, aio_loop, nursery):
    """A commit refused for a stale node epoch records nothing in PostgreSQL; the writer
    queues the object for deletion (abandoned first, so it can never be committed)."""
    from mink.storage.log import NotLeader
    from mink.storage.objectstore import open_object_store
    from tests.support.metadata import ToolMetadataStore
    from tests.test_wal import Node, append, make_topic

    metadata = await ToolMetadataStore.open(pg_url)
    try:
        objects = open_object_store("memory://")
        topic = await make_topic(metadata, 1, name="stale")
        streams = await Node(metadata, objects, 1).start(nursery)
        partition_log = await streams.open(topic.topic_id, 0, 0)
        await metadata.register_node(1, "127.0.0.1", 9001, ttl_s=30)  # fenced: a new epoch
        with trio.fail_after(10):
            with pytest.raises(NotLeader, match="stale_node_epoch"):
                await append(partition_log, [b"late"]).wait()
        [key] = await objects.list("wal/")

        async def queued() -> bool:
            return key in {k for k, _ in await metadata.pending_deletions()}

        with trio.fail_after(10):
            while not await queued():
                await trio.sleep(0.05)
        def recorded() -> str | None:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                row = conn.execute("SELECT outcome->>'reason' FROM wal_objects WHERE key = %s",
                                   (key,)).fetchone()
            return row and row[0]

        assert await trio.to_thread.run_sync(recorded) == "abandoned", \
            "queued for deletion without being recorded as abandoned first"
    finally:
        with trio.CancelScope(shield=True):
            await metadata.aclose()
