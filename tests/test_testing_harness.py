"""mink.testing, the harness users put in their tests: isolation between tests, parallel use
with pytest-xdist, clean teardown, and every fault hook doing what it says.

These tests use the plugin's fixtures as a user would (the plugin is registered by the
installed package's pytest11 entry point), plus a few pytest runs in a subprocess for what only
a whole session shows (xdist, teardown of the session's PostgreSQL, asyncio tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import confluent_kafka
import confluent_kafka.admin
import psutil
import psycopg
import pytest
import trio

from mink.testing.blocking import blocking_node

GROUP = "harness-group"


def producer(bootstrap: str, **extra) -> confluent_kafka.Producer:
    return confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                     "linger.ms": 0, **extra})


def produce_async(p: confluent_kafka.Producer, topic: str, value: bytes,
                  partition: int = 0) -> list:
    """Produce one message; the returned list gets the delivery error (None: acknowledged)."""
    outcome: list = []
    p.produce(topic, value, partition=partition, on_delivery=lambda err, msg: outcome.append(err))
    return outcome


def wait_delivered(p: confluent_kafka.Producer, outcome: list, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not outcome and time.monotonic() < deadline:
        p.poll(0.05)
    return bool(outcome)


def refused(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except OSError:
        return True


def query(url: str, sql: str, *params):
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


# -- basics and isolation -------------------------------------------------------------------


def test_broker_round_trip_with_confluent_kafka(mink_broker):
    mink_broker.create_topic("orders", partitions=2)
    p = producer(mink_broker.bootstrap)
    for i in range(6):
        p.produce("orders", f"order-{i}".encode(), key=str(i % 2).encode())
    assert p.flush(15) == 0
    messages = mink_broker.read_topic("orders")
    assert sorted(m.value for m in messages) == [f"order-{i}".encode() for i in range(6)]
    assert {m.partition for m in messages} <= {0, 1}
    for partition in (0, 1):
        offsets = [m.offset for m in messages if m.partition == partition]
        assert offsets == list(range(len(offsets)))


def test_isolation_first_leaves_a_topic_and_committed_offsets(mink_broker):
    mink_broker.create_topic("isolated")
    p = producer(mink_broker.bootstrap)
    p.produce("isolated", b"left behind")
    assert p.flush(15) == 0
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": mink_broker.bootstrap, "group.id": GROUP,
        "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe(["isolated"])
        deadline = time.monotonic() + 30
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        assert message is not None and message.error() is None
        consumer.commit(message, asynchronous=False)
    finally:
        consumer.close()
    assert query(mink_broker.cluster.postgres_url,
                 "SELECT count(*) FROM group_offsets")[0][0] == 1


def test_isolation_second_sees_nothing_of_the_first(mink_broker):
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": mink_broker.bootstrap})
    topics = admin.list_topics(timeout=10).topics
    assert "isolated" not in topics
    assert query(mink_broker.cluster.postgres_url,
                 "SELECT count(*) FROM group_offsets")[0][0] == 0
    mink_broker.create_topic("isolated")
    assert mink_broker.read_topic("isolated") == []


def test_create_topic_tries_again_when_the_coordinator_lease_moved_under_it(mink_broker):
    """The holder's lease epoch goes stale in PostgreSQL just before create_topic: the
    holder refuses (NotClusterCoordinator) and the harness tries again once the node holds
    the lease anew (it re-acquires at its next tick), instead of failing."""
    query(mink_broker.cluster.postgres_url,
          "UPDATE leases SET epoch = epoch + 1 WHERE scope = 'coordinator' RETURNING epoch")
    mink_broker.create_topic("after-a-lease-move")
    assert len(mink_broker.wait_led("after-a-lease-move")) == 1


@pytest.mark.mink(num_partitions=3)
def test_marker_settings_reach_the_node(mink_broker):
    p = producer(mink_broker.bootstrap)
    p.produce("auto-created", b"x")
    assert p.flush(15) == 0
    assert len(mink_broker.wait_led("auto-created")) == 3


async def test_trio_broker_runs_in_the_tests_own_run(mink_trio_broker):
    node = mink_trio_broker
    assert node.node is not None  # the Node object itself: same process, same trio run
    await node.create_topic("trio-topic")
    p = producer(node.bootstrap)
    p.produce("trio-topic", b"from trio")
    assert await trio.to_thread.run_sync(p.flush, 15) == 0
    assert [m.value for m in await node.read_topic("trio-topic")] == [b"from trio"]


# -- teardown -------------------------------------------------------------------------------


def test_teardown_closes_the_port_drops_the_database_removes_the_store(mink_postgres,
                                                                       _mink_harness):
    with blocking_node(_mink_harness, mink_postgres) as node:
        bootstrap = node.bootstrap
        database = node.cluster.postgres_url.rsplit("/", 1)[1]
        store = Path(node.cluster.store_url.split("file://", 1)[1].split("?")[0])
        node.create_topic("t")
        assert store.is_dir() and not refused(bootstrap)
    assert refused(bootstrap)
    assert not store.exists()
    mink_postgres.settle()  # databases given back are dropped in the background
    assert query(mink_postgres.url, "SELECT count(*) FROM pg_database WHERE datname = %s",
                 database)[0][0] == 0


def run_pytest(tmp_path: Path, test_source: str, *args: str,
               timeout: float = 240) -> subprocess.CompletedProcess:
    """A pytest session in a subprocess, as a user's project would run it, with its own
    TMPDIR (so every temporary folder the harness makes is visible to the caller)."""
    (tmp_path / "test_user.py").write_text(textwrap.dedent(test_source))
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(temp))
    env.pop("MINK_TESTING_POSTGRES_URL", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--basetemp={tmp_path / 'basetemp'}", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_session_teardown_leaves_no_process_port_or_folder(tmp_path):
    result = run_pytest(tmp_path, f"""
        def test_one(mink_broker, mink_postgres):
            mink_broker.create_topic("t")
            open({str(tmp_path / 'seen')!r}, "w").write(
                mink_broker.bootstrap + "\\n" + mink_postgres.url)
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    bootstrap, pg_url = (tmp_path / "seen").read_text().split("\n")
    assert refused(bootstrap)
    pg_port = pg_url.rsplit(":", 1)[1].split("/")[0]
    assert refused(f"127.0.0.1:{pg_port}")
    assert [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("mink-")] == []
    temp = str(tmp_path / "tmp")
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"])
            if any(temp in part for part in (p.info["cmdline"] or []))]
    assert left == []


def test_plugin_can_be_switched_off(tmp_path):
    result = run_pytest(tmp_path, """
        def test_uses_it(mink_broker):
            pass
    """, "-p", "no:mink")
    assert result.returncode != 0
    assert "fixture 'mink_broker' not found" in result.stdout


def test_plugin_imports_nothing_heavy(tmp_path):
    result = run_pytest(tmp_path, """
        import sys
        def test_nothing_loaded():
            heavy = [m for m in ("mink.broker.node", "mink.storage.controlplane", "psycopg",
                                 "trio_asyncio", "mink.testing.cluster") if m in sys.modules]
            assert heavy == []
    """)
    assert result.returncode == 0, result.stdout + result.stderr


def test_parallel_with_xdist(tmp_path):
    result = run_pytest(tmp_path, """
        import os
        import confluent_kafka
        import pytest

        @pytest.mark.parametrize("n", range(4))
        def test_same_topic_name_everywhere(mink_broker, n):
            mink_broker.create_topic("shared-name")
            p = confluent_kafka.Producer({"bootstrap.servers": mink_broker.bootstrap})
            p.produce("shared-name", f"{os.getpid()}-{n}".encode())
            assert p.flush(15) == 0
            assert [m.value for m in mink_broker.read_topic("shared-name")] == [
                f"{os.getpid()}-{n}".encode()]
    """, "-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


def test_asyncio_test_with_aiokafka(tmp_path):
    result = run_pytest(tmp_path, """
        import aiokafka
        import pytest

        @pytest.mark.asyncio
        async def test_aiokafka(mink_broker):
            mink_broker.create_topic("aio")
            producer = aiokafka.AIOKafkaProducer(bootstrap_servers=mink_broker.bootstrap)
            await producer.start()
            try:
                await producer.send_and_wait("aio", b"from asyncio")
            finally:
                await producer.stop()
            assert [m.value for m in mink_broker.read_topic("aio")] == [b"from asyncio"]
    """, "-p", "asyncio")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


# -- fault hooks ----------------------------------------------------------------------------


def test_pause_object_store_holds_acknowledgements_until_resumed(mink_broker):
    mink_broker.create_topic("paused")
    p = producer(mink_broker.bootstrap)
    mink_broker.pause_object_store()
    outcome = produce_async(p, "paused", b"held")
    assert not wait_delivered(p, outcome, 1.5), "acknowledged while the store was paused"
    mink_broker.resume_object_store()
    assert wait_delivered(p, outcome, 15) and outcome == [None]
    assert [m.value for m in mink_broker.read_topic("paused")] == [b"held"]


def test_fail_object_store_fails_uploads_until_restored(mink_broker):
    mink_broker.create_topic("failing")
    p = producer(mink_broker.bootstrap)
    mink_broker.fail_object_store()
    outcome = produce_async(p, "failing", b"retried")
    assert not wait_delivered(p, outcome, 1.5), "acknowledged while the store failed"
    failed = [c for c in mink_broker.objects.calls if c[0] == "create"]
    assert failed, "no upload was attempted"
    mink_broker.restore_object_store()
    assert wait_delivered(p, outcome, 20) and outcome == [None]
    assert [m.value for m in mink_broker.read_topic("failing")] == [b"retried"]


def test_delay_commits_delays_acknowledgements(mink_broker):
    mink_broker.create_topic("slow")
    p = producer(mink_broker.bootstrap)
    outcome = produce_async(p, "slow", b"warm-up")
    assert wait_delivered(p, outcome, 15) and outcome == [None]
    mink_broker.delay_commits(1.0)
    started = time.monotonic()
    outcome = produce_async(p, "slow", b"delayed")
    assert wait_delivered(p, outcome, 15) and outcome == [None]
    assert time.monotonic() - started >= 1.0
    mink_broker.delay_commits(0)
    started = time.monotonic()
    outcome = produce_async(p, "slow", b"prompt")
    assert wait_delivered(p, outcome, 15) and outcome == [None]
    assert time.monotonic() - started < 1.0


def test_cut_postgres_blocks_commits_until_restored(mink_broker):
    mink_broker.create_topic("cut")
    p = producer(mink_broker.bootstrap)
    mink_broker.cut_postgres()
    outcome = produce_async(p, "cut", b"after the cut")
    assert not wait_delivered(p, outcome, 1.5), "acknowledged while PostgreSQL was cut off"
    mink_broker.restore_postgres()
    assert wait_delivered(p, outcome, 30) and outcome == [None]
    assert [m.value for m in mink_broker.read_topic("cut")] == [b"after the cut"]


def live(cluster, node_id: int) -> bool:
    return query(cluster.postgres_url, "SELECT expires_at > now() FROM nodes WHERE node_id = %s",
                 node_id)[0][0]


def test_cluster_kill_leaves_membership_to_expire_and_partitions_move(mink_cluster):
    mink_cluster.create_topic("failover", partitions=3)
    p = producer(mink_cluster.bootstrap)
    for i in range(9):
        p.produce("failover", f"before-{i}".encode(), partition=i % 3)
    assert p.flush(15) == 0
    victim = mink_cluster.leaders("failover")[0]
    mink_cluster.kill(victim)
    assert live(mink_cluster, victim), "a killed node must not leave the cluster"
    leaders = mink_cluster.wait_led("failover", timeout=30)
    assert victim not in leaders.values()
    assert not live(mink_cluster, victim)  # expired by now: lease_ttl passed
    for i in range(3):
        p.produce("failover", f"after-{i}".encode(), partition=i)
    assert p.flush(30) == 0
    values = sorted(m.value for m in mink_cluster.read_topic("failover"))
    assert values == sorted([f"before-{i}".encode() for i in range(9)]
                            + [f"after-{i}".encode() for i in range(3)])
    mink_cluster.restart(victim)
    assert mink_cluster.node(victim).running and not refused(mink_cluster.node(victim).bootstrap)


def test_cluster_stop_leaves_at_once(mink_cluster):
    mink_cluster.stop(3)
    assert not live(mink_cluster, 3)
    assert refused(mink_cluster.node(3).bootstrap)
    assert mink_cluster.bootstrap.count(",") == 1


def test_move_leadership_and_back(mink_cluster):
    mink_cluster.create_topic("moving")
    first = mink_cluster.leaders("moving")[0]
    other = next(n.node_id for n in mink_cluster.nodes if n.node_id != first)
    p = producer(mink_cluster.bootstrap)
    p.produce("moving", b"at the first leader")
    assert p.flush(15) == 0
    mink_cluster.move_leadership("moving", 0, other)
    assert mink_cluster.leaders("moving")[0] == other
    p.produce("moving", b"at the second leader")
    assert p.flush(30) == 0
    mink_cluster.move_leadership("moving", 0, first)
    assert mink_cluster.leaders("moving")[0] == first
    assert [m.value for m in mink_cluster.read_topic("moving")] == [
        b"at the first leader", b"at the second leader"]


@pytest.mark.mink(nodes=2)
def test_cut_postgres_for_one_node_makes_it_stop_leading(mink_cluster):
    mink_cluster.create_topic("isolated-node", partitions=2)
    leaders = mink_cluster.leaders("isolated-node")
    victim = leaders[0]
    witness = next(n.node_id for n in mink_cluster.nodes if n.node_id != victim)
    mink_cluster.node(victim).cut_postgres()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and victim in mink_cluster.leaders(
            "isolated-node", seen_by=witness).values():
        time.sleep(0.05)
    assert victim not in mink_cluster.leaders("isolated-node", seen_by=witness).values()
    assert not mink_cluster.node(victim).node.membership.leading  # it fenced itself
    mink_cluster.node(victim).restore_postgres()
    p = producer(mink_cluster.bootstrap)
    p.produce("isolated-node", b"still served", partition=0)
    assert p.flush(30) == 0


def test_psycopg_imported_before_mink(tmp_path):
    """psycopg.waiting bound the unpatched asyncio.get_running_loop when imported before
    trio_asyncio: every node's PostgreSQL connection then failed ("no running event loop")."""
    result = run_pytest(tmp_path, """
        import psycopg  # first, as a user's conftest or another plugin may do
        import psycopg.waiting

        def test_node_starts(mink_broker):
            mink_broker.create_topic("t")
    """)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.mink(nodes=2)
async def test_trio_cluster_kill_and_restart(mink_trio_cluster):
    cluster = mink_trio_cluster
    await cluster.create_topic("trio-failover", partitions=2)
    victim = cluster.leaders("trio-failover")[0]
    await cluster.kill(victim)
    leaders = await cluster.wait_led("trio-failover", timeout=30)
    assert set(leaders.values()) == {n.node_id for n in cluster.nodes if n.node_id != victim}
    await cluster.restart(victim)
    assert cluster.node(victim).running and cluster.node(victim).starts == 2


def test_layering_harness_internals_come_from_one_module():
    """Nothing in mink imports mink.testing; mink.testing reaches Mink's internals only
    through mink/testing/_parts.py (one file to edit when they move)."""
    import ast

    root = Path(__file__).resolve().parent.parent / "mink"
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        names = [node.module for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module]
        names += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                  for alias in node.names]
        ours = [n for n in names if n == "mink" or n.startswith("mink.")]
        inside = path.relative_to(root).parts[0] == "testing"
        if not inside:
            assert not [n for n in ours if n.startswith("mink.testing")], path
        elif path.name != "_parts.py":
            assert [n for n in ours if not n.startswith("mink.testing")] == [], path
