"""Load generators for `benchmarks.kafka`, each run in its own process.

    python -m benchmarks.loadgen <worker> '<json params>'

The node under test is single-threaded Python and the machine may have two cores, so the
clients never share a process (nor a GIL) with a node: `benchmarks.kafka` starts one of these
per measurement. Protocol on stdout, one line each: `START` when the measured window begins,
`READY` where a worker waits for the orchestrator (which answers with a line on stdin), and
finally `RESULT <json>`. Anything else on stdout or stderr is logged by the orchestrator.

Times are `time.monotonic_ns()` (CLOCK_MONOTONIC, the same clock in every process of the
machine), so a timestamp written by one process can be compared with another's.
"""

from __future__ import annotations

import json
import math
import os
import resource
import socket
import struct
import sys
import threading
import time
from collections import Counter
from typing import Any


MB = 1_000_000
STAMP = struct.Struct(">q")

# Quantiles kept for the CDF plots (percent).
CDF_POINTS = ([i * 0.5 for i in range(0, 200)] + [99.0 + i * 0.1 for i in range(1, 10)]
              + [99.9 + i * 0.01 for i in range(1, 10)] + [99.99, 100.0])


def emit(tag: str, payload: Any = None) -> None:
    line = tag if payload is None else f"{tag} {json.dumps(payload)}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def nearest_rank(data: list, q: float):
    if not data:
        return None
    rank = max(1, math.ceil(q / 100 * len(data)))
    return data[min(rank, len(data)) - 1]


def latency_summary(ns_values: list[int], cdf: bool = True) -> dict[str, Any]:
    """Percentiles (nearest rank) of durations in ns, reported in ms."""
    data = sorted(ns_values)
    if not data:
        return {"n": 0}

    def ms(v):
        return None if v is None else round(v / 1e6, 3)

    out = {"n": len(data), "mean_ms": ms(sum(data) / len(data)), "min_ms": ms(data[0]),
           "p50_ms": ms(nearest_rank(data, 50)), "p90_ms": ms(nearest_rank(data, 90)),
           "p99_ms": ms(nearest_rank(data, 99)), "p999_ms": ms(nearest_rank(data, 99.9)),
           "max_ms": ms(data[-1])}
    if cdf:
        out["cdf"] = [[q, ms(nearest_rank(data, q) if q > 0 else data[0])] for q in CDF_POINTS]
    return out


def p99_by_second(ns_values: list[int], sent_ns: list[int], start_ns: int) -> list[float]:
    """The p99 (ms) of the durations of what was sent in each second from `start_ns`: a tail
    made of a few bad seconds (a periodic burst of other work) looks different here from
    one spread over all of them."""
    seconds: dict[int, list[int]] = {}
    for value, sent in zip(ns_values, sent_ns, strict=True):
        seconds.setdefault(max(0, (sent - start_ns) // 1_000_000_000), []).append(value)
    return [round(nearest_rank(sorted(v), 99) / 1e6, 2) for _, v in sorted(seconds.items())]


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class StdinLines:
    """Lines from the orchestrator, read by a thread so that the worker never blocks on it.
    One per process: `control()`."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.event = threading.Event()
        self.eof = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        for line in sys.stdin:
            self.lines.append(line.strip())
            self.event.set()
        self.eof.set()
        self.event.set()

    def wait(self, timeout: float | None = None) -> str | None:
        if not self.lines:
            self.event.wait(timeout)
        self.event.clear()
        return self.lines.pop(0) if self.lines else None


_control: StdinLines | None = None


def control() -> StdinLines:
    global _control
    if _control is None:
        _control = StdinLines()
    return _control


def _producer(params: dict, on_delivery) -> Any:
    from confluent_kafka import Producer

    config = {"bootstrap.servers": params["bootstrap"], "client.id": "mink-bench",
              **params.get("producer_config", {})}
    if on_delivery is not None:
        config["on_delivery"] = on_delivery
    return Producer(config)


def _values(size: int, count: int = 16) -> list[bytes]:
    return [os.urandom(size) for _ in range(count)]


def _warm_up(producer: Any, params: dict, topic: str, partitions: list[int], size: int) -> None:
    """A few messages per partition, awaited: connections, metadata and leaders are known
    before the measured window starts. Their values start with 8 zero bytes: a tailing
    consumer skips them (send time 0)."""
    value = bytes(8) + os.urandom(size - 8)
    for _ in range(params.get("warmup_per_partition", 20)):
        for p in partitions:
            producer.produce(topic, value, key=STAMP.pack(time.monotonic_ns()), partition=p)
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"warm-up: {remaining} messages not delivered within 60 s")


# -- produce: closed-loop throughput --------------------------------------------------------


def produce(params: dict) -> dict:
    """As fast as the producer's queue allows, for `duration` s, then flush. Acknowledged
    payload (values) per second from the first send to the last delivery report."""
    topic, size = params["topic"], params["value_bytes"]
    partitions = list(range(params["partitions"]))
    stats = {"acked": 0, "last_ack": 0, "errors": Counter()}

    def on_delivery(err, msg):
        if err is None:
            stats["acked"] += 1
        else:
            stats["errors"][err.name()] += 1

    producer = _producer(params, on_delivery)
    _warm_up(producer, params, topic, partitions, size)
    stats["acked"] = 0
    values = _values(size)
    n_values = len(values)
    n_parts = len(partitions)
    queue_full = 0
    sent = 0
    emit("START")
    cpu0 = cpu_seconds()
    started = time.monotonic()
    end = started + params["duration"]
    limit = params.get("max_messages") or float("inf")
    produce_ = producer.produce
    while time.monotonic() < end and sent < limit:
        for _ in range(int(min(1000, limit - sent))):
            try:
                produce_(topic, values[sent % n_values], partition=partitions[sent % n_parts])
                sent += 1
            except BufferError:
                queue_full += 1
                producer.poll(0.001)
        producer.poll(0)
    send_end = time.monotonic()
    remaining = producer.flush(120)
    finished = time.monotonic()
    cpu = cpu_seconds() - cpu0
    elapsed = finished - started
    acked_bytes = stats["acked"] * size
    return {
        "partitions": n_parts, "value_bytes": size, "sent": sent,
        "acked": stats["acked"], "errors": dict(stats["errors"]),
        "not_delivered": remaining, "queue_full_waits": queue_full,
        "send_seconds": round(send_end - started, 3), "drain_seconds": round(finished - send_end, 3),
        "seconds": round(elapsed, 3),
        "mb_per_s": round(acked_bytes / MB / elapsed, 2),
        "msgs_per_s": round(stats["acked"] / elapsed, 1),
        "window": [started, finished],
        "client_cpu_pct": round(100 * cpu / elapsed, 1),
    }


# -- paced: open-loop produce latency (and the producer side of end-to-end) ----------------


SLICE_NS = 1_000_000


def paced(params: dict) -> dict:
    """Messages at a fixed rate, sent in 1 ms slices whatever the acks do; latency = delivery
    report time - produce() time (the send time travels in the key, 8 bytes). With `stamp`
    the value's first 8 bytes carry it too, for a tailing consumer. With `warmup_seconds`
    the same rate is sent that long first, unmeasured (a steady state rather than a start);
    its messages' latencies are never counted, even if they are delivered in the window."""
    topic, size = params["topic"], params["value_bytes"]
    partitions = list(range(params["partitions"]))
    rate = params["rate_mb_s"] * MB
    interval_ns = size / rate * 1e9
    stamp = params.get("stamp", False)
    latencies: list[int] = []
    sent_at: list[int] = []  # each latency's produce() time, for the p99 of each second
    stats = {"errors": Counter(), "last_ack": 0, "counted_from": 0}

    def on_delivery(err, msg, _now=time.monotonic_ns, _unpack=STAMP.unpack):
        now = _now()
        if err is not None:
            stats["errors"][err.name()] += 1
            return
        t = _unpack(msg.key())[0]
        if t < stats["counted_from"]:
            return
        latencies.append(now - t)
        sent_at.append(t)
        stats["last_ack"] = now

    producer = _producer(params, on_delivery)
    _warm_up(producer, params, topic, partitions, size)
    values = _values(size)
    tails = [v[8:] for v in values]
    n_values, n_parts = len(values), len(partitions)
    produce_, now_ns, pack = producer.produce, time.monotonic_ns, STAMP.pack

    def send_paced(start: int, seconds: float) -> tuple[int, int, list[int]]:
        end = start + int(seconds * 1e9)
        total = int((end - start) / interval_ns)
        lags: list[int] = []
        sent = queue_full = 0
        while sent < total:
            now = now_ns()
            due = min(total, int((now - start) / interval_ns) + 1) if now >= start else 0
            if due > sent:
                lags.append(now - int(start + sent * interval_ns))
            while sent < due:
                t = now_ns()
                key = pack(t)
                value = key + tails[sent % n_values] if stamp else values[sent % n_values]
                try:
                    produce_(topic, value, key=key, partition=partitions[sent % n_parts])
                except BufferError:
                    queue_full += 1
                    producer.poll(0.0005)
                    continue
                sent += 1
            # Sleep to the next slice (librdkafka's poll counts whole ms): at 20 MB/s a
            # message is due every 49 us, and waking for each one cost the generator a third
            # of a core on a machine whose two cores it shares with the node.
            wake = max(start + sent * interval_ns, now_ns() + SLICE_NS)
            producer.poll(min(max((wake - now_ns()) / 1e9, 0.001), 0.01))
        return sent, queue_full, lags

    warmup = params.get("warmup_seconds", 0)
    if warmup:
        send_paced(time.monotonic_ns(), warmup)
    emit("START")
    cpu0 = cpu_seconds()
    start = time.monotonic_ns() + 2_000_000
    latencies.clear()
    sent_at.clear()
    stats["counted_from"] = start
    sent, queue_full, lags = send_paced(start, params["duration"])
    send_end = now_ns()
    remaining = producer.flush(120)
    finished = now_ns()
    cpu = cpu_seconds() - cpu0
    acked = len(latencies)
    return {
        "partitions": n_parts, "value_bytes": size, "offered_mb_per_s": params["rate_mb_s"],
        "sent": sent, "acked": acked, "errors": dict(stats["errors"]), "not_delivered": remaining,
        "queue_full_waits": queue_full,
        "send_seconds": round((send_end - start) / 1e9, 3),
        "drain_seconds": round((finished - send_end) / 1e9, 3),
        "sent_mb_per_s": round(sent * size / MB / ((send_end - start) / 1e9), 2),
        "achieved_mb_per_s": round(acked * size / MB / ((max(stats["last_ack"], send_end) - start) / 1e9), 2),
        "latency": latency_summary(latencies),
        "p99_ms_by_second": p99_by_second(latencies, sent_at, start),
        "schedule_lag": latency_summary(lags, cdf=False),
        "window": [start / 1e9, finished / 1e9],
        "client_cpu_pct": round(100 * cpu / ((finished - start) / 1e9), 1),
    }


# -- tail: the consumer side of end-to-end latency ------------------------------------------


def tail(params: dict) -> dict:
    """assign() every partition at its end (its high watermark, asked first, so that nothing
    produced after READY is skipped), then: latency = time poll() hands the message over -
    the send time in the value's first 8 bytes. Stops on a line on stdin (after a grace
    period for the last messages) or at `max_seconds`."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": params["bootstrap"], "group.id": "mink-bench-tail",
                         "enable.auto.commit": False, "client.id": "mink-bench-tail",
                         **params.get("consumer_config", {})})
    topic = params["topic"]
    ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(params["partitions"])]
    consumer.assign([TopicPartition(topic, p, end) for p, end in enumerate(ends)])
    ctl = control()
    # A second of polling: connections made and long-polling fetches in place before READY.
    warm_until = time.monotonic() + params.get("warmup_seconds", 1.0)
    while time.monotonic() < warm_until:
        consumer.poll(0.1)
    emit("READY")
    latencies: list[int] = []
    errors: Counter[str] = Counter()
    stop_at = time.monotonic() + params.get("max_seconds", 120)
    now_ns, unpack = time.monotonic_ns, STAMP.unpack_from
    cpu0 = cpu_seconds()
    started = time.monotonic()
    expected = None
    warmup = 0
    while time.monotonic() < stop_at:
        # poll(), not consume(n, timeout): consume waits for n messages or the timeout.
        msg = consumer.poll(0.05)
        if msg is not None:
            now = now_ns()
            if msg.error():
                errors[msg.error().name()] += 1
            else:
                sent = unpack(msg.value())[0]
                if sent:
                    latencies.append(now - sent)
                else:
                    warmup += 1
        if expected is None and ctl.lines:
            line = ctl.wait(0)
            if line and line.startswith("STOP"):
                parts = line.split()
                expected = int(parts[1]) if len(parts) > 1 else 0
                stop_at = min(stop_at, time.monotonic() + params.get("grace_seconds", 5))
        if expected is not None and len(latencies) >= expected:
            break
    finished = time.monotonic()
    cpu = cpu_seconds() - cpu0
    consumer.close()
    return {"received": len(latencies), "expected": expected, "errors": dict(errors),
            "warmup_messages_skipped": warmup,
            "latency": latency_summary(latencies),
            "client_cpu_pct": round(100 * cpu / (finished - started), 1)}


# -- catchup: read everything from the start, as fast as possible ---------------------------


def catchup(params: dict) -> dict:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": params["bootstrap"],
                         "group.id": "mink-bench-catchup", "enable.auto.commit": False,
                         "client.id": "mink-bench-catchup",
                         **params.get("consumer_config", {})})
    topic, expected = params["topic"], params["expected_messages"]
    emit("START")
    cpu0 = cpu_seconds()
    started = time.monotonic()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(params["partitions"])])
    count = nbytes = 0
    first = last = None
    errors: Counter[str] = Counter()
    deadline = started + params.get("max_seconds", 300)
    while count < expected and time.monotonic() < deadline:
        # consume() returns when it has that many messages or at the timeout: never ask for
        # more than are left.
        msgs = consumer.consume(min(10000, expected - count), 0.5)
        if not msgs:
            continue
        now = time.monotonic()
        if first is None:
            first = now
        last = now
        for msg in msgs:
            if msg.error():
                errors[msg.error().name()] += 1
            else:
                count += 1
                nbytes += len(msg)
    finished = time.monotonic()
    cpu = cpu_seconds() - cpu0
    consumer.close()
    elapsed = (last or finished) - started
    return {"expected": expected, "received": count, "payload_bytes": nbytes,
            "errors": dict(errors), "seconds": round(elapsed, 3),
            "first_message_s": None if first is None else round(first - started, 3),
            "mb_per_s": round(nbytes / MB / elapsed, 2) if elapsed > 0 else None,
            "msgs_per_s": round(count / elapsed, 1) if elapsed > 0 else None,
            "window": [started, finished],
            "client_cpu_pct": round(100 * cpu / (finished - started), 1)}


# -- raw Kafka requests over a blocking socket ----------------------------------------------


class RawConnection:
    def __init__(self, address: str, timeout: float = 60.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation = 0

    def send(self, api_key: int, version: int, body: Any) -> None:
        from mink.protocol.messages import encode_request

        self.correlation += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation, body, "mink-bench"))

    def receive_frame(self) -> bytes:
        header = self._exactly(4)
        (size,) = struct.unpack(">i", header)
        return self._exactly(size)

    def _exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if not k:
                raise EOFError("connection closed by the node")
            got += k
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def metadata_request(version: int = 12, topics: list[str] | None = None) -> Any:
    from kio.index import load_request_schema

    from mink.protocol.messages import build, nested

    schema = load_request_schema(3, version)
    requested = None
    if topics is not None:
        topic_schema = nested(schema, "MetadataRequestTopic")
        requested = tuple(build(topic_schema, name=t, topic_id=None) for t in topics)
    return build(schema, topics=requested, allow_auto_topic_creation=False,
                 include_cluster_authorized_operations=False,
                 include_topic_authorized_operations=False)


def api_versions_request(version: int = 3) -> Any:
    from kio.index import load_request_schema

    from mink.protocol.messages import build

    return build(load_request_schema(18, version), client_software_name="mink-bench",
                 client_software_version="1.0")


def _metadata_errors(frame: bytes, version: int = 12, skip_internal: bool = True
                     ) -> dict[str, int]:
    from mink.protocol.messages import decode_response

    _, body = decode_response(3, version, frame)
    topics = partitions = errors = 0
    for topic in body.topics:
        if skip_internal and topic.name.startswith("__"):
            continue
        topics += 1
        for p in topic.partitions:
            partitions += 1
            errors += int(p.error_code) != 0
    return {"topics": topics, "partitions": partitions, "partition_errors": errors}


def metadata_wait(params: dict) -> dict:
    """Metadata for every topic, repeated until `partitions` partitions answer without error
    (all opened by their leader); the time from `since_ns` until then."""
    conn = RawConnection(params["address"])
    deadline = time.monotonic() + params.get("max_seconds", 300)
    samples = []
    while True:
        t0 = time.monotonic_ns()
        conn.send(3, 12, metadata_request())
        frame = conn.receive_frame()
        t1 = time.monotonic_ns()
        counts = _metadata_errors(frame)
        samples.append({"at_s": round((t1 - params["since_ns"]) / 1e9, 3),
                        "ms": round((t1 - t0) / 1e6, 2), **counts})
        if counts["partitions"] >= params["partitions"] and counts["partition_errors"] == 0:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(params.get("interval", 0.5))
    conn.close()
    return {"ready_s": samples[-1]["at_s"], "ready": samples[-1]["partition_errors"] == 0
            and samples[-1]["partitions"] >= params["partitions"], "polls": samples}


def metadata_timing(params: dict) -> dict:
    """One Metadata request for every topic on a new connection (the node's first answer for
    the current view: encoded, not cached), then `repeats` more (cached); then the same
    through confluent-kafka's AdminClient.list_topics() (librdkafka parses it too)."""
    from confluent_kafka.admin import AdminClient

    conn = RawConnection(params["address"])
    times = []
    size = 0
    for _ in range(1 + params.get("repeats", 20)):
        t0 = time.monotonic_ns()
        conn.send(3, 12, metadata_request())
        frame = conn.receive_frame()
        times.append(time.monotonic_ns() - t0)
        size = len(frame)
    counts = _metadata_errors(frame)
    conn.close()
    admin = AdminClient({"bootstrap.servers": params["address"]})
    admin_times = []
    topics = partitions = 0
    for _ in range(params.get("admin_repeats", 3)):
        t0 = time.monotonic_ns()
        md = admin.list_topics(timeout=60)
        admin_times.append(time.monotonic_ns() - t0)
        topics = len(md.topics)
        partitions = sum(len(t.partitions) for t in md.topics.values())
    repeated = sorted(times[1:])
    return {"response_bytes": size, **counts,
            "first_ms": round(times[0] / 1e6, 2),
            "repeated_p50_ms": round(nearest_rank(repeated, 50) / 1e6, 2) if repeated else None,
            "repeated_max_ms": round(repeated[-1] / 1e6, 2) if repeated else None,
            "repeated_n": len(repeated),
            "admin_list_topics_ms": [round(t / 1e6, 1) for t in admin_times],
            "admin_topics": topics, "admin_partitions": partitions}


def _round_trips(address: str, n: int) -> list[int]:
    conn = RawConnection(address)
    out = []
    for _ in range(n):
        t0 = time.monotonic_ns()
        conn.send(18, 3, api_versions_request())
        conn.receive_frame()
        out.append(time.monotonic_ns() - t0)
    conn.close()
    return sorted(out)


def connections(params: dict) -> dict:
    """Open `count` connections, each sending one ApiVersions and reading the answer, and
    hold them idle until told to close. ApiVersions round trips on one more connection are
    measured before and while they are held."""
    raise_fd_limit()
    address, count = params["address"], params["count"]
    ctl = control()
    before = _round_trips(address, 50)
    t0 = time.monotonic()
    conns = []
    for _ in range(count):
        conn = RawConnection(address)
        conn.send(18, 3, api_versions_request())
        conns.append(conn)
    for conn in conns:  # answers read after every request is out: connects do not wait on them
        conn.receive_frame()
    opened = time.monotonic() - t0
    emit("READY")
    ctl.wait(120)
    during = _round_trips(address, 50)
    # Every connection still open and answering?
    alive = 0
    for conn in conns:
        try:
            conn.send(18, 3, api_versions_request())
            conn.receive_frame()
            alive += 1
        except OSError:
            pass
    for conn in conns:
        conn.close()
    return {"count": count, "open_all_seconds": round(opened, 3), "alive_after": alive,
            "api_versions_rtt_before_p50_ms": round(nearest_rank(before, 50) / 1e6, 3),
            "api_versions_rtt_held_p50_ms": round(nearest_rank(during, 50) / 1e6, 3),
            "api_versions_rtt_held_p99_ms": round(nearest_rank(during, 99) / 1e6, 3)}


# -- failover: first acknowledged produce after a leader's SIGKILL ---------------------------


def failover(params: dict) -> dict:
    """Produce one message every `interval_ms` to each of `partitions` (those the victim
    leads); print READY once each has acks; the orchestrator kills the victim and writes
    `KILLED <monotonic_ns>`. Result: per partition, the first acknowledged message sent after
    the kill, as delivery-report time - kill time."""
    topic, targets = params["topic"], params["partitions"]
    ctl = control()
    acks: dict[int, list[tuple[int, int]]] = {p: [] for p in targets}  # (sent, acked)
    errors: Counter[str] = Counter()

    def on_delivery(err, msg, _now=time.monotonic_ns, _unpack=STAMP.unpack):
        now = _now()
        if err is not None:
            errors[err.name()] += 1
            return
        acks[msg.partition()].append((_unpack(msg.key())[0], now))

    producer = _producer(params, on_delivery)
    value = os.urandom(params.get("value_bytes", 1024))
    interval = params.get("interval_ms", 10) / 1000
    killed_ns = None
    ready = False
    deadline = time.monotonic() + params.get("max_seconds", 90)
    sent = 0
    while time.monotonic() < deadline:
        for p in targets:
            producer.produce(topic, value, key=STAMP.pack(time.monotonic_ns()), partition=p)
            sent += 1
        producer.poll(interval)
        if not ready and all(len(a) >= 5 for a in acks.values()):
            ready = True
            emit("READY")
        if ready and killed_ns is None and ctl.lines:
            line = ctl.wait(0)
            if line and line.startswith("KILLED"):
                killed_ns = int(line.split()[1])
        if killed_ns is not None and all(any(s > killed_ns for s, _ in a) for a in acks.values()):
            break
    producer.flush(30)
    per_partition = {}
    for p, a in acks.items():
        after = [acked for s, acked in a if killed_ns is not None and s > killed_ns]
        per_partition[p] = round((min(after) - killed_ns) / 1e9, 3) if after else None
        # Also: the first ack at all after the kill (messages sent before it, retried).
    first_any = None
    if killed_ns is not None:
        after_any = [acked for a in acks.values() for _, acked in a if acked > killed_ns]
        first_any = round((min(after_any) - killed_ns) / 1e9, 3) if after_any else None
    values = [v for v in per_partition.values() if v is not None]
    return {"partitions": targets, "killed": killed_ns is not None, "sent": sent,
            "acked": sum(len(a) for a in acks.values()), "errors": dict(errors),
            "first_ack_after_kill_by_partition_s": {str(k): v for k, v in per_partition.items()},
            "first_produce_after_kill_s": min(values) if values else None,
            "all_partitions_after_kill_s": max(values) if len(values) == len(targets) else None,
            "first_ack_of_any_message_after_kill_s": first_any}


# -- baseline: bytes from a socket into the object store, no Mink ---------------------------


def baseline_client(params: dict) -> dict:
    """Length-prefixed chunks as fast as the socket takes them, for `duration` s, then an empty
    frame; the server answers with 8 bytes once every chunk is written to the store."""
    chunk = os.urandom(params["chunk_bytes"])
    frame = struct.pack(">I", len(chunk)) + chunk
    host, port = params["address"].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    emit("START")
    cpu0 = cpu_seconds()
    started = time.monotonic()
    end = started + params["duration"]
    sent = 0
    while time.monotonic() < end:
        sock.sendall(frame)
        sent += 1
    sock.sendall(struct.pack(">I", 0))
    reply = b""
    while len(reply) < 8:
        data = sock.recv(8 - len(reply))
        if not data:
            raise EOFError("baseline server closed the connection")
        reply += data
    finished = time.monotonic()
    sock.close()
    written = struct.unpack(">q", reply)[0]
    elapsed = finished - started
    return {"chunks_sent": sent, "chunks_written": written, "chunk_bytes": len(chunk),
            "seconds": round(elapsed, 3),
            "mb_per_s": round(written * len(chunk) / MB / elapsed, 2),
            "window": [started, finished],
            "client_cpu_pct": round(100 * (cpu_seconds() - cpu0) / elapsed, 1)}


WORKERS = {f.__name__: f for f in (produce, paced, tail, catchup, metadata_wait, metadata_timing,
                                   connections, failover, baseline_client)}


def main(argv: list[str]) -> int:
    name, params = argv[0], json.loads(argv[1])
    control()
    result = WORKERS[name](params)
    emit("RESULT", result)
    # Stay until the orchestrator has read this process's CPU time and closes stdin.
    control().eof.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
