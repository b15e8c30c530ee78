"""Mink nodes inside the caller's trio run: `open_node()` and `open_cluster(n)`.

    async with open_cluster(3, postgres) as cluster:
        await cluster.create_topic("orders", partitions=6)   # returns once every partition is led
        ... produce with any Kafka client to cluster.bootstrap ...
        await cluster.kill(2)                                 # as after a crash: nothing released
        await cluster.wait_led("orders")
        assert [m.value for m in await cluster.read_topic("orders")] == [...]

Each node is a real Mink node (`run_node`: its own trio_asyncio loop, PostgreSQL pool, Kafka
listener on a free loopback port, WAL, sync and coordinator loops), run as a task of the
cluster's nursery. The cluster's nodes share one fresh database (cloned from the migrated
template) and one fresh `file://` store folder, both removed when the cluster closes.

Every node reaches PostgreSQL through its own TCP proxy when `mink.testing.proxy` is there,
so PostgreSQL can be made unreachable for one node or all. Fault hooks are methods in pairs,
each undoing the other: `pause_object_store`/`resume_object_store`,
`fail_object_store`/`restore_object_store`, `delay_commits(s)`/`delay_commits(0)`,
`cut_postgres`/`restore_postgres`, `stall_postgres`/`resume_postgres`,
`delay_postgres(s)`/`delay_postgres(0)`, `kill`/`restart`, `move_leadership` (and back).
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import outcome
import trio

from mink.testing.postgres import TestPostgres

log = logging.getLogger(__name__)

# Settings a test wants: short leases so a killed node's partitions move within seconds,
# one __consumer_offsets partition per node (Kafka's own test setups use one), no initial
# rebalance delay. Any of them can be overridden per node or cluster.
NODE_DEFAULTS: dict[str, Any] = dict(
    lease_ttl=6.0, coordinator_tick=1.0, offsets_topic_num_partitions=1,
    group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=1000,
)
CLUSTER_DEFAULTS: dict[str, Any] = dict(NODE_DEFAULTS, lease_ttl=3.0, coordinator_tick=0.5)


class NodeNotRunning(RuntimeError):
    pass


@dataclass(frozen=True)
class Message:
    """A committed record, as a consumer would read it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


class MinkNode:
    """One node of a cluster. `node` is the running `mink.broker.node.Node` (None while
    stopped): reach into it only to look, the harness's methods are the supported way in."""

    def __init__(self, cluster: MinkCluster, node_id: int, config: Any, objects: Any) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.config = config
        self.objects = objects  # a FaultyObjectStore around the cluster's store
        self.proxy: Any = None  # a TcpProxy between this node and PostgreSQL, if there
        self.node: Any = None
        self.starts = 0
        self.commit_delay = 0.0
        self._scope: trio.CancelScope | None = None
        self._finished: trio.Event | None = None
        self._jobs: trio.MemorySendChannel | None = None
        self._paused: trio.Event | None = None
        self._unpause: Callable[[], None] | None = None
        self._unfail: Callable[[], None] | None = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<MinkNode {self.node_id} {state} at {self.bootstrap}>"

    @property
    def running(self) -> bool:
        return self.node is not None

    @property
    def bootstrap(self) -> str:
        """host:port of its Kafka listener (kept across restarts)."""
        return self.config.listener

    @property
    def postgres_url(self) -> str:
        """The URL this node uses (through its proxy when there is one)."""
        return self.config.postgres_url

    # -- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self.running:
            return
        from mink.testing import _parts

        self.starts += 1
        finished = trio.Event()
        self._finished = finished

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            try:
                with trio.CancelScope() as scope:
                    self._scope = scope
                    await _parts.run_node(
                        self.config, objects=self.objects,
                        # the process is the test run's: its heap is not the node's to freeze
                        freeze_heap=False,
                        # the database is a clone of the template this code migrated
                        migrate=False,
                        on_started=self._on_started, task_status=task_status)
            finally:
                self.node = None
                self._scope = None
                if self._jobs is not None:
                    self._jobs.close()
                    self._jobs = None
                finished.set()

        host, port = await self.cluster._nursery.start(run)
        if self.config.listener.endswith(":0"):  # a restart listens where clients look
            self.config = _replace(self.config, listener=f"{host}:{port}")

    def _on_started(self, node: Any) -> None:
        """Called inside the node's own task, where its trio_asyncio loop is current: work
        that touches its stores runs in tasks spawned from here."""
        self.node = node
        send, receive = trio.open_memory_channel(math.inf)
        self._jobs = send
        node.nursery.start_soon(self._run_jobs, receive)
        self._wrap_commits(node)

    async def _run_jobs(self, receive: trio.MemoryReceiveChannel) -> None:
        async with trio.open_nursery() as nursery:
            async for job in receive:
                nursery.start_soon(job)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `await fn(*args)` inside this node's run (its trio_asyncio loop current):
        how the harness calls the node's metadata store. NodeNotRunning if it stops."""
        jobs = self._jobs
        if jobs is None:
            raise NodeNotRunning(f"node {self.node_id} is not running")
        box: list[outcome.Outcome] = []
        done = trio.Event()

        async def job() -> None:
            try:
                box.append(await outcome.acapture(fn, *args))
            finally:
                done.set()

        jobs.send_nowait(job)
        await done.wait()
        if not box:
            raise NodeNotRunning(f"node {self.node_id} stopped during the call")
        return box[0].unwrap()

    async def stop(self) -> None:
        """A clean stop: the node leaves the cluster and releases its leases."""
        await self._end(leave=True)

    async def kill(self) -> None:
        """As after SIGKILL: its connections drop, nothing is released; its partitions move
        once its membership expires (lease_ttl) and the coordinator ticks."""
        await self._end(leave=False)

    async def _end(self, leave: bool) -> None:
        if not self.running:
            return
        self.node.leave_on_stop = leave
        self._scope.cancel()
        await self._finished.wait()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    # -- the cluster's topic helpers, for a node opened alone -----------------------------

    async def create_topic(self, name: str, partitions: int = 1,
                           config: dict[str, str] | None = None, *,
                           timeout: float = 15.0) -> None:
        """See MinkCluster.create_topic."""
        await self.cluster.create_topic(name, partitions, config, timeout=timeout)

    async def wait_led(self, topic: str, *, timeout: float = 15.0) -> dict[int, int]:
        """See MinkCluster.wait_led."""
        return await self.cluster.wait_led(topic, timeout=timeout)

    def leaders(self, topic: str) -> dict[int, int | None]:
        return self.cluster.leaders(topic, seen_by=self.node_id)

    async def read_topic(self, topic: str, *, timeout: float = 15.0) -> list[Message]:
        """See MinkCluster.read_topic."""
        return await self.cluster.read_topic(topic, timeout=timeout)

    async def move_leadership(self, topic: str, partition: int, to_node: int, *,
                              timeout: float = 15.0) -> None:
        await self.cluster.move_leadership(topic, partition, to_node, timeout=timeout)

    # -- faults -------------------------------------------------------------------------------

    def pause_object_store(self) -> None:
        """Every object store call of this node waits until `resume_object_store()`."""
        if self._paused is None:
            self._paused = trio.Event()
            self._unpause = self.objects.stall("*", self._paused)

    def resume_object_store(self) -> None:
        if self._paused is not None:
            self._unpause()
            self._paused.set()
            self._paused = self._unpause = None

    def fail_object_store(self) -> None:
        """Every object store call of this node fails (ObjectStoreUnavailable, as an
        unreachable S3 would) until `restore_object_store()`."""
        if self._unfail is None:
            self._unfail = self.objects.fail_when(lambda op, key: True)

    def restore_object_store(self) -> None:
        if self._unfail is not None:
            self._unfail()
            self._unfail = None

    def delay_commits(self, seconds: float) -> None:
        """Each WAL commit in PostgreSQL starts `seconds` late (0: no delay). Produce
        acknowledgements wait for it; a delay past `commit_timeout` makes the outcome unknown."""
        self.commit_delay = max(0.0, seconds)

    def _wrap_commits(self, node: Any) -> None:
        metadata = node.metadata
        commit = metadata.commit_wal

        async def delayed_commit(*args: Any, **kwargs: Any) -> Any:
            if self.commit_delay:
                await trio.sleep(self.commit_delay)
            return await commit(*args, **kwargs)

        metadata.commit_wal = delayed_commit  # looked up at each commit by the WAL writer

    def cut_postgres(self) -> None:
        """PostgreSQL becomes unreachable for this node: its connections are cut and new
        ones refused, until `restore_postgres()`."""
        self._require_proxy().cut()

    def restore_postgres(self) -> None:
        self._require_proxy().restore()

    def stall_postgres(self) -> None:
        """Connections to PostgreSQL stay open but nothing passes, until `resume_postgres()`."""
        self._require_proxy().stall()

    def resume_postgres(self) -> None:
        self._require_proxy().resume()

    def delay_postgres(self, seconds: float) -> None:
        """Every chunk between this node and PostgreSQL is held `seconds` (0: no delay)."""
        self._require_proxy().set_delay(seconds)

    def _require_proxy(self) -> Any:
        if self.proxy is None:
            raise RuntimeError("PostgreSQL faults need mink.testing.proxy (TcpProxy)")
        return self.proxy

    def clear_faults(self) -> None:
        self.resume_object_store()
        self.restore_object_store()
        self.delay_commits(0)
        if self.proxy is not None:
            self.proxy.restore()
            self.proxy.resume()
            self.proxy.set_delay(0)


class MinkCluster:
    """N nodes on one database and one store. Methods taking a `node_id` act on that node;
    the fault methods without one act on every node."""

    def __init__(self, nursery: trio.Nursery, postgres_url: str, store_url: str) -> None:
        self._nursery = nursery
        self.postgres_url = postgres_url  # the database itself, not through a proxy
        self.store_url = store_url
        self.nodes: list[MinkNode] = []

    def __repr__(self) -> str:
        return f"<MinkCluster {self.nodes}>"

    def node(self, node_id: int) -> MinkNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id} in this cluster")

    @property
    def bootstrap(self) -> str:
        """The listeners of the running nodes, comma-separated (a client's bootstrap.servers)."""
        return ",".join(n.bootstrap for n in self.nodes if n.running)

    def running_nodes(self) -> list[MinkNode]:
        return [n for n in self.nodes if n.running]

    # -- life cycle of nodes ------------------------------------------------------------------

    async def kill(self, node_id: int) -> None:
        await self.node(node_id).kill()

    async def stop(self, node_id: int) -> None:
        await self.node(node_id).stop()

    async def start(self, node_id: int) -> None:
        await self.node(node_id).start()

    async def restart(self, node_id: int) -> None:
        await self.node(node_id).restart()

    # -- topics -------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int = 1,
                           config: dict[str, str] | None = None, *,
                           timeout: float = 15.0) -> None:
        """Create a topic through the cluster coordinator; returns once every partition is
        led and every running node knows it."""
        from mink.testing import _parts

        with trio.fail_after(timeout):
            while True:
                holder = self._coordinator()
                if holder is not None:
                    try:
                        await holder.call(holder.node.topic_admin.create_topic, name,
                                          partitions, dict(config or {}))
                        break
                    except (_parts.NotClusterCoordinator, _parts.MetadataUnavailable,
                            NodeNotRunning):
                        pass
                await trio.sleep(0.02)
        await self.wait_led(name, timeout=timeout)

    def _coordinator(self) -> MinkNode | None:
        for n in self.running_nodes():
            if n.node.coordinator.is_holder and n.node.membership.leading:
                return n
        return None

    def leaders(self, topic: str, *, seen_by: int | None = None) -> dict[int, int | None]:
        """partition -> leader node id, as the view of node `seen_by` says (default: the
        first running node that knows the topic)."""
        nodes = [self.node(seen_by)] if seen_by is not None else self.running_nodes()
        for n in nodes:
            if n.node is None:
                continue
            info = n.node.view.topics.get(topic)
            if info is not None:
                return {p.index: p.leader for p in info.partitions}
        raise KeyError(f"no running node knows topic {topic!r}")

    def _led(self, topic: str) -> tuple[bool, str]:
        running = {n.node_id: n for n in self.running_nodes()}
        if not running:
            return False, "no node is running"
        leaders = None
        for n in running.values():
            info = n.node.view.topics.get(topic)
            if info is None:
                return False, f"node {n.node_id} does not know {topic!r} yet"
            mine = {p.index: p.leader for p in info.partitions}
            if leaders is None:
                leaders = mine
            elif mine != leaders:
                return False, f"the nodes' views disagree on the leaders ({leaders} {mine})"
        for index, leader in leaders.items():
            n = running.get(leader)
            if n is None:
                return False, f"partition {index}'s leader {leader} is not running"
            info = n.node.view.topics[topic]
            if n.node.leader_log(info, index) is None:
                return False, f"node {leader} has not opened partition {index} yet"
        return True, ""

    async def wait_led(self, topic: str, *, timeout: float = 15.0) -> dict[int, int]:
        """Wait until every partition of `topic` is open on its leader and every running node
        agrees who that is; returns partition -> leader."""
        why = ""
        with trio.move_on_after(timeout):
            while True:
                ok, why = self._led(topic)
                if ok:
                    return self.leaders(topic)
                await trio.sleep(0.01)
        raise TimeoutError(f"{topic!r} not led within {timeout}s: {why}")

    async def move_leadership(self, topic: str, partition: int, to_node: int, *,
                              timeout: float = 15.0) -> None:
        """Make `to_node` lead the partition (a coordinator action, as a rebalance does);
        returns once it has opened it."""
        from mink.testing import _parts

        with trio.fail_after(timeout):
            while True:
                holder = self._coordinator()
                if holder is not None:
                    info = holder.node.view.topics[topic]
                    p = info.partitions[partition]
                    if p.leader == to_node:
                        break
                    try:
                        await holder.call(
                            holder.node.metadata.lead_partitions,
                            [(info.topic_id, partition, to_node, p.leader_epoch)],
                            holder.node.coordinator.lease_epoch)
                        await holder.call(holder.node.sync.refresh_view)
                        break
                    except (_parts.StaleEpoch, _parts.MetadataUnavailable, NodeNotRunning):
                        pass
                await trio.sleep(0.02)
            while True:
                ok, _ = self._led(topic)
                if ok and self.leaders(topic)[partition] == to_node:
                    return
                await trio.sleep(0.01)

    async def read_topic(self, topic: str, *, timeout: float = 15.0) -> list[Message]:
        """Everything committed to `topic`, read from its leaders' logs (not through a Kafka
        client), by partition then offset. Control batches (transaction markers) are left out."""
        await self.wait_led(topic, timeout=timeout)
        running = {n.node_id: n for n in self.running_nodes()}
        messages: list[Message] = []
        for index, leader in sorted(self.leaders(topic).items()):
            n = running[leader]
            info = n.node.view.topics[topic]
            partition_log = n.node.leader_log(info, index)
            if partition_log is None:
                raise NodeNotRunning(f"partition {index} of {topic!r} closed while reading")
            messages.extend(await n.call(_read_partition, topic, index, partition_log))
        return messages

    # -- faults on every node -----------------------------------------------------------------

    def pause_object_store(self) -> None:
        for n in self.nodes:
            n.pause_object_store()

    def resume_object_store(self) -> None:
        for n in self.nodes:
            n.resume_object_store()

    def fail_object_store(self) -> None:
        for n in self.nodes:
            n.fail_object_store()

    def restore_object_store(self) -> None:
        for n in self.nodes:
            n.restore_object_store()

    def delay_commits(self, seconds: float) -> None:
        for n in self.nodes:
            n.delay_commits(seconds)

    def cut_postgres(self) -> None:
        for n in self.nodes:
            n.cut_postgres()

    def restore_postgres(self) -> None:
        for n in self.nodes:
            n.restore_postgres()

    def stall_postgres(self) -> None:
        for n in self.nodes:
            n.stall_postgres()

    def resume_postgres(self) -> None:
        for n in self.nodes:
            n.resume_postgres()

    def delay_postgres(self, seconds: float) -> None:
        for n in self.nodes:
            n.delay_postgres(seconds)

    def clear_faults(self) -> None:
        for n in self.nodes:
            n.clear_faults()


async def _read_partition(topic: str, index: int, partition_log: Any) -> list[Message]:
    from mink.testing import _parts

    out: list[Message] = []
    offset = partition_log.log_start_offset
    end = partition_log.committed_end  # the high watermark
    while offset < end:
        chunks = await partition_log.read(offset, 4 * 1024 * 1024)
        if not chunks:
            break
        for chunk in chunks:
            for header, batch in _parts.iter_batches(chunk):
                if header.is_control:
                    offset = max(offset, header.base_offset + header.last_offset_delta + 1)
                    continue
                for record in _parts.iter_records(batch):
                    record_offset = header.base_offset + record.offset_delta
                    if record_offset < offset or record_offset >= end:
                        continue
                    out.append(Message(topic, index, record_offset, record.key, record.value,
                                       tuple(record.headers),
                                       header.base_timestamp + record.timestamp_delta))
                offset = max(offset, header.base_offset + header.last_offset_delta + 1)
    return out


def _replace(config: Any, **changes: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(config, **changes)


def _proxy_class() -> Any:
    try:
        from mink.testing.proxy import TcpProxy
    except ImportError:
        return None
    return TcpProxy


@asynccontextmanager
async def open_cluster(nodes: int = 3, postgres: TestPostgres | None = None, *,
                       store_url: str | None = None, proxy: bool = True,
                       node_config: dict[int, dict[str, Any]] | None = None,
                       **config: Any) -> AsyncIterator[MinkCluster]:
    """`nodes` Mink nodes (ids 1..n) in the caller's trio run, on a fresh database of
    `postgres` (a TestPostgres, started and stopped here when None) and a fresh store.
    `config` overrides Config fields for every node (e.g. num_partitions=3), `node_config`
    those of one node ({2: {"rack": "b"}})."""
    async with _open(nodes, postgres, store_url, proxy, {**CLUSTER_DEFAULTS, **config},
                     node_config) as c:
        yield c


@asynccontextmanager
async def open_node(postgres: TestPostgres | None = None, *, store_url: str | None = None,
                    proxy: bool = True, **config: Any) -> AsyncIterator[MinkNode]:
    """One Mink node in the caller's trio run; see open_cluster. The node's `cluster`
    attribute has the topic helpers too; the node offers them directly."""
    async with _open(1, postgres, store_url, proxy, {**NODE_DEFAULTS, **config}) as cluster:
        yield cluster.nodes[0]


@asynccontextmanager
async def _open(count: int, postgres: TestPostgres | None, store_url: str | None,
                proxy: bool, config: dict[str, Any],
                per_node: dict[int, dict[str, Any]] | None = None
                ) -> AsyncIterator[MinkCluster]:
    from mink.testing import _parts

    own_postgres = postgres is None
    if own_postgres:
        postgres = TestPostgres()
        await trio.to_thread.run_sync(postgres.start)
    folder: Path | None = None
    database: str | None = None
    objects: list[Any] = []
    proxies: list[Any] = []
    try:
        database = await trio.to_thread.run_sync(postgres.new_database)
        if store_url is None:
            folder = Path(tempfile.mkdtemp(prefix="mink-testing-store-"))
            store_url = folder.as_uri() + "?fsync=false"
        proxy_class = _proxy_class() if proxy else None
        async with trio.open_nursery() as nursery:
            cluster = MinkCluster(nursery, database, store_url)
            for node_id in range(1, count + 1):
                url = database
                node_proxy = None
                if proxy_class is not None:
                    host, port = postgres.address
                    node_proxy = proxy_class(host, port)
                    await nursery.start(node_proxy.run)
                    proxies.append(node_proxy)
                    p_host, p_port = node_proxy.address
                    url = _with_address(database, p_host, p_port)
                store = _parts.FaultyObjectStore(_parts.open_object_store(store_url))
                objects.append(store)
                node_config = _parts.Config(**{
                    "node_id": node_id, "listener": "127.0.0.1:0", "postgres_url": url,
                    "object_store": store_url, **config,
                    **(per_node or {}).get(node_id, {})})
                node = MinkNode(cluster, node_id, node_config, store)
                node.proxy = node_proxy
                cluster.nodes.append(node)
            async with trio.open_nursery() as starting:  # nodes start side by side
                for node in cluster.nodes:
                    starting.start_soon(node.start)
            try:
                yield cluster
            finally:
                with trio.CancelScope(shield=True):
                    for node in cluster.nodes:
                        node.clear_faults()
                    async with trio.open_nursery() as stopping:
                        for node in cluster.nodes:
                            stopping.start_soon(node.stop)
                    nursery.cancel_scope.cancel()  # the proxies
    finally:
        with trio.CancelScope(shield=True):
            for store in objects:
                await store.aclose()
            if database is not None:
                # dropped in the background, before the next spare is cloned
                await trio.to_thread.run_sync(
                    lambda: postgres.drop_database(database, wait=False))
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            if own_postgres:
                await trio.to_thread.run_sync(postgres.stop)


def _with_address(url: str, host: str, port: int) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}:{port}"))
