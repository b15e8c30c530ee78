"""Control-plane scale (issue 22): one node with 100,000 partitions, and a failover of 100,000
partitions over three nodes.

    .venv/bin/python -m benchmarks.control_plane [--topics 1000] [--partitions 100]
        [--per-request 50] [--idle-s 60] [--profile-s 30] [--produce-s 20]
        [--failover] [--out DIR]

`mink serve` nodes (production timing: lease_ttl 30 s, coordinator_tick 5 s) on an embedded
PostgreSQL (fsync off) and a file:// store.

One node (the default): `--topics` x `--partitions` created `--per-request` topics per
CreateTopics request, each request timed (and so the first topics against the last); the time
until every partition is led and open; then, idle, the node's and PostgreSQL's CPU over
`--idle-s` (process CPU time / wall time, from /proc), the node's RSS, Metadata for every topic
(topics null, as clients ask) timed to the first and the last byte of its answer: the first
answer (every topic laid out), answers after a topic was created (encoded again, unchanged
topics' bytes kept) and cached ones (the same question again); a py-spy profile of the idle node
(`--profile-s`, raw format, summarized by benchmarks.profile_summary); then acks=all produce
latency to one of its partitions against a second node with nothing else on it, in the same
run, alternating.

`--failover`: three nodes share the partitions; one is killed with SIGKILL, and the time from
the kill to every partition it led being led and open on a live node is measured against
`lease_ttl + coordinator_tick + 10 s`.

Results: `results/control-plane-<ts>.json`, `.md` (and `-profile.txt` when profiled).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

import psycopg  # noqa: E402
from kio.index import load_request_schema  # noqa: E402

from mink.client import BlockingKafkaClient  # noqa: E402
from mink.protocol.apis import ApiKey  # noqa: E402
from mink.protocol.messages import build, nested  # noqa: E402
from mink.storage.embedded_postgres import EmbeddedPostgres, free_port  # noqa: E402

RESULTS = Path(__file__).with_name("results")
REPO = Path(__file__).resolve().parent.parent
LEASE_TTL, TICK = 30.0, 5.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

SQL_NOT_OPEN = """
SELECT count(*) FROM partitions p JOIN topics t USING (topic_id)
 WHERE t.deleted_at IS NULL AND NOT (p.leader_node IS NOT NULL AND p.stream_state = 'open'
   AND p.opened_by_node = p.leader_node AND p.open_leader_epoch = p.leader_epoch)"""
SQL_NOT_MOVED = """
SELECT count(*) FROM partitions p JOIN topics t USING (topic_id)
 WHERE t.deleted_at IS NULL AND t.name LIKE 'cp-%%'
   AND (p.topic_id, p.partition) IN (SELECT * FROM unnest(%s::uuid[], %s::int[]))
   AND NOT (p.leader_node <> %s AND p.stream_state = 'open'
            AND p.opened_by_node = p.leader_node AND p.open_leader_epoch = p.leader_epoch)"""


class Node:
    def __init__(self, node_id: int, db_url: str, store: str, log_dir: Path,
                 stalls: bool = False, **extra):
        self.node_id = node_id
        self.address = f"127.0.0.1:{free_port()}"
        self.env = {**os.environ, "MINK_NODE_ID": str(node_id), "MINK_LISTENER": self.address,
                    "MINK_POSTGRES_URL": db_url, "MINK_OBJECT_STORE": store,
                    "MINK_LOG_LEVEL": "INFO", "MINK_LEASE_TTL": str(LEASE_TTL),
                    "MINK_COORDINATOR_TICK": str(TICK),
                    **{f"MINK_{k.upper()}": str(v) for k, v in extra.items()}}
        name = f"node-{node_id}-{self.address.rsplit(':', 1)[1]}"
        self.log_path = log_dir / f"{name}.log"
        # --stalls: the node runs under benchmarks.latency_node, which logs its garbage
        # collections and its task steps of 20 ms or more (the event loop held)
        self.command = ["-m", "mink.cli", "serve"]
        self.gc_log = self.stall_log = None
        if stalls:
            self.command = ["-m", "benchmarks.latency_node"]
            self.gc_log, self.stall_log = log_dir / f"{name}-gc.log", log_dir / f"{name}-stalls"
            self.env.update(MINK_BENCH_GC_LOG=str(self.gc_log),
                            MINK_BENCH_STALL_LOG=str(self.stall_log))
        self.process: subprocess.Popen | None = None

    def pauses(self, start: float, end: float) -> list[str]:
        """The garbage collections (generation >= 1, >= 1 ms) and task steps of 20 ms or
        more that ended in [start, end] (time.monotonic()), longest first."""
        found = []
        for path, kind in ((self.gc_log, "gc"), (self.stall_log, "step")):
            if path is None or not path.exists():
                continue
            for line in path.read_text().splitlines():
                fields = line.split()
                at = float(fields[0])
                if start <= at <= end:
                    ms = float(fields[2] if kind == "gc" else fields[1])
                    what = f"gen {fields[1]}" if kind == "gc" else " ".join(fields[2:])
                    found.append((ms, f"{kind} {ms:.0f} ms ({what})"))
        return [text for _, text in sorted(found, reverse=True)]

    def start(self, timeout: float = 120) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, *self.command], cwd=REPO,
                                            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        marker = f"listening for Kafka clients on {self.address}"
        wait_for(lambda: marker in self.log_path.read_text(errors="replace") or (
            self.process.poll() is not None and _raise(self.log_path)), timeout, "the node")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


def _raise(log_path: Path):
    raise RuntimeError(log_path.read_text(errors="replace")[-3000:])


def wait_for(condition, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
    return total


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def postgres_pids(pg: EmbeddedPostgres) -> list[int]:
    """The server and its backends: every process whose command is postgres's, whose data
    directory is ours (the postmaster) or whose parent is the postmaster."""
    postmaster = int((pg.data_dir / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                pids.append(int(entry.name))
    return pids


def create_topics(client: BlockingKafkaClient, names: list[str], partitions: int) -> None:
    version = client.version(ApiKey.CREATE_TOPICS)
    schema = load_request_schema(ApiKey.CREATE_TOPICS, version)
    topic = nested(schema, "CreatableTopic")
    body = build(schema, topics=tuple(
        build(topic, name=n, num_partitions=partitions, replication_factor=1, assignments=(),
              configs=()) for n in names),
        timeout=datetime.timedelta(seconds=120), validate_only=False)
    response = client.call(ApiKey.CREATE_TOPICS, version, body)
    failed = [(t.name, t.error_code) for t in response.topics if t.error_code != 0]
    if failed:
        raise RuntimeError(f"CreateTopics refused: {failed[:5]}")


def timed_metadata(client: BlockingKafkaClient, names: list[str] | None
                   ) -> tuple[float, float, int]:
    """Seconds from sending a Metadata request naming `names` (None: every topic, as clients
    ask) to the first byte of its answer (the node's cost) and to the last (the transfer of
    megabytes over loopback into this Python client on top), and the answer's size. Not
    decoded: the client's decoding is not the node's cost."""
    import uuid

    version = client.version(ApiKey.METADATA)
    schema = load_request_schema(ApiKey.METADATA, version)
    topic = nested(schema, "MetadataRequestTopic")
    body = build(schema, topics=None if names is None else tuple(
        build(topic, name=n, topic_id=uuid.UUID(int=0)) for n in names),
        allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False)
    exchange = client.exchange
    _, frame = exchange.encode(ApiKey.METADATA, version, body)
    started = time.perf_counter()
    client.sock.sendall(frame)
    first = None
    while (answer := exchange.reader.next_frame()) is None:
        data = client.sock.recv(1 << 20)
        if first is None:
            first = time.perf_counter() - started
        if not data:
            raise RuntimeError("the node closed the connection")
        exchange.reader.feed(data)
    return first, time.perf_counter() - started, len(answer)


def produce_latencies(bootstrap: str, topic: str, seconds: float, rate: float = 200) -> list:
    """acks=all, one 1 KiB message every 1/rate s to partition 0: ms from send to ack."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "enable.idempotence": True})
    latencies: list[float] = []
    errors: list = []
    value = b"x" * 1024
    producer.produce(topic, value=value, partition=0)  # connections, metadata: not timed
    producer.flush(30)
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    while time.monotonic() < end:
        sent = time.perf_counter()

        def delivered(err, msg, sent=sent):
            if err:
                errors.append(str(err))
            else:
                latencies.append((time.perf_counter() - sent) * 1000)

        producer.produce(topic, value=value, partition=0, on_delivery=delivered)
        producer.poll(0)
        next_at += 1 / rate
        while (pause := next_at - time.monotonic()) > 0:
            producer.poll(min(pause, 0.005))
    producer.flush(30)
    if errors:
        raise RuntimeError(f"produce errors: {errors[:3]}")
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def new_database(pg: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return pg.url_for(name)


def create_all(client: BlockingKafkaClient, args) -> list[float]:
    """Every topic, `--per-request` per CreateTopics; seconds per topic of each request."""
    names = [f"cp-{t:05d}" for t in range(args.topics)]
    per_topic = []
    for start in range(0, len(names), args.per_request):
        batch = names[start:start + args.per_request]
        began = time.perf_counter()
        create_topics(client, batch, args.partitions)
        per_topic.append((time.perf_counter() - began) / len(batch))
        done = start + len(batch)
        if done % (10 * args.per_request) == 0 or done == len(names):
            print(f"  {done} topics: {per_topic[-1] * 1000:.1f} ms a topic", flush=True)
    return per_topic


def one_node(pg: EmbeddedPostgres, tmp: Path, args) -> dict:
    db = new_database(pg, "cp_big")
    store = tmp / "objects-big"
    store.mkdir()
    node = Node(1, db, store.as_uri(), tmp, stalls=args.stalls, num_partitions=1)
    out: dict = {}
    empty = None
    try:
        node.start()
        conn = psycopg.connect(db, autocommit=True)
        client = BlockingKafkaClient(node.address, 300)
        began = time.monotonic()
        per_topic = create_all(client, args)
        out["create_s"] = time.monotonic() - began
        out["per_topic_ms"] = [round(t * 1000, 2) for t in per_topic]
        k = max(1, len(per_topic) // 10)
        out["first_tenth_ms"] = statistics.median(per_topic[:k]) * 1000
        out["last_tenth_ms"] = statistics.median(per_topic[-k:]) * 1000
        created = time.monotonic()
        wait_for(lambda: conn.execute(SQL_NOT_OPEN).fetchone()[0] == 0, 600,
                 "every partition open", interval=0.5)
        out["led_after_create_s"] = time.monotonic() - created
        print(f"created in {out['create_s']:.1f} s; all led {out['led_after_create_s']:.1f} s "
              "later", flush=True)
        time.sleep(10)  # settle: the last opens' follow-ups
        pgs = postgres_pids(pg)
        cpu0, pg0, t0 = cpu_seconds([node.process.pid]), cpu_seconds(pgs), time.monotonic()
        time.sleep(args.idle_s)
        wall = time.monotonic() - t0
        out["idle_node_cpu_pct"] = 100 * (cpu_seconds([node.process.pid]) - cpu0) / wall
        out["idle_postgres_cpu_pct"] = 100 * (cpu_seconds(postgres_pids(pg)) - pg0) / wall
        out["node_rss_mib"] = rss_mib(node.process.pid)
        print(f"idle: node {out['idle_node_cpu_pct']:.1f}% of a core, PostgreSQL "
              f"{out['idle_postgres_cpu_pct']:.1f}%, RSS {out['node_rss_mib']:.0f} MiB",
              flush=True)
        # Metadata of every topic (topics null, as clients ask): the first answer lays out
        # every topic; after a change (a topic created) the answer is encoded again, with
        # the unchanged topics' bytes kept; asked again, the encoded answer is sent as is.
        runs = {"cold": [timed_metadata(client, None)], "after_change": [], "cached": []}
        for i in range(5):
            create_topics(client, [f"cp-extra-{i}"], 1)
            runs["after_change"].append(timed_metadata(client, None))
            runs["cached"].append(timed_metadata(client, None))
        for name, timings in runs.items():
            out[f"metadata_{name}_ms"] = statistics.median(r[0] for r in timings) * 1000
            out[f"metadata_{name}_received_ms"] = statistics.median(r[1] for r in timings) * 1000
        out["metadata_bytes"] = runs["cached"][-1][2]
        print("Metadata of every topic, to the first byte (last byte): " + ", ".join(
            f"{name} {out[f'metadata_{name}_ms']:.1f} ms "
            f"({out[f'metadata_{name}_received_ms']:.1f} ms)" for name in runs)
            + f", {out['metadata_bytes']} bytes", flush=True)
        client.close()
        if args.profile_s > 0:
            profile = tmp / "profile.txt"
            subprocess.run([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(node.process.pid), "-d",
                            str(int(args.profile_s)), "-r", "100", "-f", "raw", "-o", str(profile)],
                           check=True, capture_output=True)
            out["profile"] = profile.read_text()
        # produce latency: here and on a node with nothing else, alternating
        empty_db = new_database(pg, "cp_empty")
        empty_store = tmp / "objects-empty"
        empty_store.mkdir()
        empty = Node(2, empty_db, empty_store.as_uri(), tmp, stalls=args.stalls,
                     num_partitions=1)
        empty.start()
        with BlockingKafkaClient(empty.address, 60) as empty_client:
            create_topics(empty_client, ["cp-00000"], 1)
        rounds = {"loaded": [], "empty": []}
        pauses: dict[str, list[str]] = {"loaded": [], "empty": []}
        for _ in range(2):
            for name, target in (("loaded", node), ("empty", empty)):
                began = time.monotonic()
                rounds[name] += produce_latencies(target.address, "cp-00000", args.produce_s)
                pauses[name] += target.pauses(began, time.monotonic())
        if args.stalls:
            out["produce_pauses"] = {name: found[:10] for name, found in pauses.items()}
            print(f"pauses while producing: {out['produce_pauses']}", flush=True)
        for name, values in rounds.items():
            out[f"produce_{name}_p50_ms"] = percentile(values, 0.5)
            out[f"produce_{name}_p99_ms"] = percentile(values, 0.99)
            out[f"produce_{name}_n"] = len(values)
        print(f"produce p99: {out['produce_loaded_p99_ms']:.2f} ms here, "
              f"{out['produce_empty_p99_ms']:.2f} ms on an empty node", flush=True)
        conn.close()
    finally:
        node.kill()
        if empty is not None:
            empty.kill()
    return out


def failover(pg: EmbeddedPostgres, tmp: Path, args) -> dict:
    db = new_database(pg, "cp_failover")
    store = tmp / "objects-failover"
    store.mkdir()
    nodes = {i: Node(i, db, store.as_uri(), tmp, num_partitions=1) for i in (1, 2, 3)}
    out: dict = {}
    try:
        for node in nodes.values():
            node.start()
        conn = psycopg.connect(db, autocommit=True)
        wait_for(lambda: conn.execute("SELECT count(*) FROM nodes WHERE expires_at > now()")
                 .fetchone()[0] == 3, 60, "three live nodes")
        with BlockingKafkaClient(nodes[1].address, 300) as client:
            began = time.monotonic()
            create_all(client, args)
            out["create_s"] = time.monotonic() - began
        wait_for(lambda: conn.execute(SQL_NOT_OPEN).fetchone()[0] == 0, 600,
                 "every partition open", interval=0.5)
        time.sleep(10)
        victim = 2
        led = conn.execute("SELECT topic_id, partition FROM partitions p JOIN topics t "
                           "USING (topic_id) WHERE t.name LIKE 'cp-%%' AND leader_node = %s",
                           (victim,)).fetchall()
        keys = ([k[0] for k in led], [k[1] for k in led], victim)
        killed = time.monotonic()
        nodes[victim].kill()
        bound = LEASE_TTL + TICK + 10
        wait_for(lambda: conn.execute(SQL_NOT_MOVED, keys).fetchone()[0] == 0, 600,
                 "every partition of the killed node open elsewhere", interval=0.2)
        out["moved_partitions"] = len(led)
        out["failover_s"] = time.monotonic() - killed
        out["bound_s"] = bound
        print(f"SIGKILL: {len(led)} partitions led and open elsewhere after "
              f"{out['failover_s']:.1f} s (bound {bound:.0f} s)", flush=True)
        conn.close()
    finally:
        for node in nodes.values():
            node.kill()
    return out


def report(args, stamp: str, result: dict) -> list[str]:
    lines = [f"# Control-plane scale, {stamp}", "",
             f"`python -m benchmarks.control_plane {' '.join(sys.argv[1:])}`", "",
             f"{args.topics} topics x {args.partitions} partitions "
             f"({args.topics * args.partitions:,}), created {args.per_request} topics per "
             f"CreateTopics; `mink serve` with lease_ttl {LEASE_TTL:g} s, coordinator_tick "
             f"{TICK:g} s, file:// store, embedded PostgreSQL (fsync off); load average "
             f"{result['load_before']} before, {os.getloadavg()[0]:.1f} after.", ""]
    one = result.get("one_node")
    if one:
        lines += ["| figure | measured | target |", "| --- | ---: | --- |",
                  f"| created | {one['create_s']:.1f} s | < 60 s |",
                  f"| a topic, first tenth / last tenth (median) | {one['first_tenth_ms']:.1f} / "
                  f"{one['last_tenth_ms']:.1f} ms | within 20% |",
                  f"| all led and open after the last creation | "
                  f"{one['led_after_create_s']:.1f} s | < 60 s |",
                  f"| idle node CPU | {one['idle_node_cpu_pct']:.1f}% of a core | < 3% |",
                  f"| idle PostgreSQL CPU | {one['idle_postgres_cpu_pct']:.1f}% of a core | < 3% |",
                  f"| Metadata, every topic, uncached: the first answer (first byte; last "
                  f"byte) | {one['metadata_cold_ms']:.0f} ms; "
                  f"{one['metadata_cold_received_ms']:.0f} ms | < 300 ms |",
                  f"| Metadata, every topic, uncached: after a topic was created | "
                  f"{one['metadata_after_change_ms']:.1f} ms; "
                  f"{one['metadata_after_change_received_ms']:.1f} ms | < 300 ms |",
                  f"| Metadata, every topic, cached (first byte; last byte) | "
                  f"{one['metadata_cached_ms']:.2f} ms; "
                  f"{one['metadata_cached_received_ms']:.1f} ms | < 1 ms |",
                  f"| node RSS | {one['node_rss_mib']:.0f} MiB | < 600 MiB |",
                  f"| produce p99 here / on an empty node (p50) | "
                  f"{one['produce_loaded_p99_ms']:.2f} / {one['produce_empty_p99_ms']:.2f} ms "
                  f"({one['produce_loaded_p50_ms']:.2f} / {one['produce_empty_p50_ms']:.2f}) | "
                  "within 10% |", ""]
        for name, found in one.get("produce_pauses", {}).items():
            lines.append(f"- event loop held while producing ({name} node), longest first: "
                         + ("; ".join(found) if found else "none of 20 ms or more"))
        if one.get("produce_pauses"):
            lines.append("")
    fo = result.get("failover")
    if fo:
        lines += [f"Three nodes, SIGKILL of node 2: {fo['moved_partitions']:,} partitions led "
                  f"and open on a live node after {fo['failover_s']:.1f} s (bound: lease_ttl + "
                  f"coordinator_tick + 10 s = {fo['bound_s']:.0f} s); created in "
                  f"{fo['create_s']:.1f} s.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--per-request", type=int, default=50)
    parser.add_argument("--idle-s", type=float, default=60)
    parser.add_argument("--profile-s", type=float, default=30)
    parser.add_argument("--produce-s", type=float, default=20)
    parser.add_argument("--failover", action="store_true", help="the three-node run only")
    parser.add_argument("--stalls", action="store_true",
                        help="log the nodes' collections and long task steps (latency_node)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mink-cp-"))
    pg = EmbeddedPostgres(tmp / "pg" / "data", durable=False)
    result: dict = {"topics": args.topics, "partitions": args.partitions,
                    "per_request": args.per_request,
                    "load_before": f"{os.getloadavg()[0]:.1f}"}
    try:
        pg.start()
        if args.failover:
            result["failover"] = failover(pg, tmp, args)
        else:
            result["one_node"] = one_node(pg, tmp, args)
    finally:
        if pg.running():
            pg.stop("immediate")
        profile = result.get("one_node", {}).pop("profile", None)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        args.out.mkdir(parents=True, exist_ok=True)
        if profile:
            (args.out / f"control-plane-{stamp}-profile.txt").write_text(profile)
        (args.out / f"control-plane-{stamp}.json").write_text(json.dumps(result, indent=2))
        lines = report(args, stamp, result) if any(
            k in result for k in ("one_node", "failover")) else [f"# failed, {stamp}"]
        (args.out / f"control-plane-{stamp}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
