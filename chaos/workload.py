"""The workload: producers and group consumers with stock clients, each in its own thread,
recording every send, acknowledgement, read and commit in the history; and the final read.

Producers (each message has a unique id `<producer>.<session>-<seq>`, used as key and value):
- `idem`: confluent-kafka with enable.idempotence (acks=all implied)
- `kpy`: kafka-python's KafkaProducer with its defaults (idempotent with acks=all since 2.1;
  what it really ran with is recorded from its config)
- `plain`: confluent-kafka, enable.idempotence=false, acks=all, retries on (may duplicate and
  reorder on retries, as in Kafka)
A producer that hits a fatal error starts a new session (a new producer id), recorded as such.

And on a topic of its own, `txn`: confluent-kafka with a transactional.id, transactions of a
few messages each, committed or (one in five, from the run's seed) aborted; each message's id
and each transaction's outcome recorded (`txn_send`, `txn_end`). The final read of that topic
is read_committed (librdkafka's default).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from typing import Any

from chaos.history import History

log = logging.getLogger("chaos")
# librdkafka's own log lines (disconnects, retries: many under faults) go here, not to stderr;
# the campaign writes this logger to the run's clients.log.
CLIENT_LOG = logging.getLogger("chaos.clients")


class Worker(threading.Thread):
    def __init__(self, name: str, history: History) -> None:
        super().__init__(name=name, daemon=True)
        self.history = history
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # reported by the campaign, never silently lost
            self.error = exc
            log.exception("%s failed", self.name)
            self.history.record("worker_error", worker=self.name, error=repr(exc))

    def work(self) -> None:
        raise NotImplementedError


class Pacer:
    """Sleeps so that calls to `wait()` happen `rate` times a second on average."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = time.monotonic()

    def wait(self) -> None:
        self.next += self.interval
        delay = self.next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -1.0:  # fell behind (a blocked send): do not burst to catch up
            self.next = time.monotonic()


class ConfluentProducer(Worker):
    def __init__(self, name: str, history: History, bootstrap: str, topic: str, rate: float,
                 idempotent: bool) -> None:
        super().__init__(name, history)
        self.bootstrap, self.topic, self.rate, self.idempotent = bootstrap, topic, rate, idempotent
        self.fatal: str | None = None
        self.in_flight = 0

    def _config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "enable.idempotence": self.idempotent,
            "acks": "all",
            "linger.ms": 5,
            # The idempotent producer keeps librdkafka's default (300 s). With 30 s, stalls
            # of 30-50 s (every node self-fencing under clock-pg, kills on a loaded machine)
            # timed messages out, and librdkafka then bumps its epoch and re-sends batches that
            # may be stored as new batches from sequence 0 (seeds 633 and 635: 894 and 2,532
            # duplicates; librdkafka#4953). Kafka's own check takes those too, so they say
            # nothing about Mink; the stalls themselves are reported as liveness.
            "message.timeout.ms": 300000 if self.idempotent else 30000,
            "request.timeout.ms": 10000,
            "retry.backoff.ms": 100,
            "max.in.flight.requests.per.connection": 5,
            "error_cb": self._on_error,
            "logger": CLIENT_LOG,
        }

    def _on_error(self, err: Any) -> None:
        if err.fatal():
            self.fatal = str(err)

    def work(self) -> None:
        from confluent_kafka import Producer

        session = 0
        while not self.stopping.is_set():
            producer_name = f"{self.name}.{session}"
            self.fatal = None
            config = {**self._config(), "client.id": producer_name}
            if os.environ.get("CHAOS_RDKAFKA_DEBUG"):  # e.g. "broker,msg,protocol"
                config["debug"] = os.environ["CHAOS_RDKAFKA_DEBUG"]
            producer = Producer(config)
            self.history.record("producer", producer=producer_name, client="confluent-kafka",
                                idempotent=self.idempotent, acks="all")
            self._produce(producer, producer_name)
            remaining = producer.flush(60 if self.stopping.is_set() else 5)
            self.history.record("producer_closed", producer=producer_name,
                                undelivered=remaining, fatal=self.fatal)
            session += 1

    def _produce(self, producer: Any, producer_name: str) -> None:
        pacer = Pacer(self.rate)
        seq = 0
        history = self.history

        def delivered(err: Any, msg: Any, message_id: str) -> None:
            if err is not None:
                history.record("fail", producer=producer_name, id=message_id, error=str(err))
            else:
                history.record("ack", producer=producer_name, id=message_id,
                               partition=msg.partition(), offset=msg.offset())

        while not self.stopping.is_set() and self.fatal is None:
            message_id = f"{producer_name}-{seq}"
            value = message_id.encode()
            while True:
                try:
                    history.record("send", producer=producer_name, id=message_id, seq=seq)
                    producer.produce(self.topic, key=value, value=value,
                                     on_delivery=lambda err, msg, i=message_id: delivered(err, msg, i))
                    break
                except BufferError:
                    producer.poll(0.1)
            seq += 1
            producer.poll(0)
            pacer.wait()


class KafkaPythonProducer(Worker):
    def __init__(self, name: str, history: History, bootstrap: str, topic: str,
                 rate: float) -> None:
        super().__init__(name, history)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate

    def work(self) -> None:
        from kafka import KafkaProducer

        session = 0
        while not self.stopping.is_set():
            producer_name = f"{self.name}.{session}"
            producer = KafkaProducer(bootstrap_servers=self.bootstrap.split(","),
                                     client_id=producer_name)
            config = producer.config
            self.history.record("producer", producer=producer_name, client="kafka-python",
                                idempotent=bool(config.get("enable_idempotence")),
                                acks=config.get("acks"))
            error = self._produce(producer, producer_name)
            try:
                producer.flush(timeout=60 if self.stopping.is_set() else 5)
            except Exception as exc:
                error = error or repr(exc)
            try:
                producer.close(timeout=5)
            except Exception as exc:  # the cluster may be gone already (interrupted run)
                error = error or repr(exc)
            self.history.record("producer_closed", producer=producer_name, fatal=error)
            session += 1

    def _produce(self, producer: Any, producer_name: str) -> str | None:
        pacer = Pacer(self.rate)
        history = self.history
        seq = 0
        while not self.stopping.is_set():
            message_id = f"{producer_name}-{seq}"
            value = message_id.encode()
            history.record("send", producer=producer_name, id=message_id, seq=seq)
            try:
                future = producer.send(self.topic, key=value, value=value)
            except Exception as exc:  # the producer is unusable: a new session
                history.record("fail", producer=producer_name, id=message_id, error=repr(exc))
                return repr(exc)
            future.add_callback(lambda md, i=message_id: history.record(
                "ack", producer=producer_name, id=i, partition=md.partition, offset=md.offset))
            future.add_errback(lambda exc, i=message_id: history.record(
                "fail", producer=producer_name, id=i, error=repr(exc)))
            seq += 1
            pacer.wait()
        return None


class TransactionalProducer(Worker):
    """Transactions of `size` messages; outcome per transaction: commit, abort, or unknown
    (the commit call failed in a way that leaves it undecided to the client)."""

    def __init__(self, name: str, history: History, bootstrap: str, topic: str, rate: float,
                 seed: int, size: int = 5) -> None:
        super().__init__(name, history)
        self.bootstrap, self.topic, self.rate, self.size = bootstrap, topic, rate, size
        self.rng = random.Random(seed)

    def work(self) -> None:
        from confluent_kafka import KafkaException, Producer

        session = 0
        while not self.stopping.is_set():
            producer_name = f"{self.name}.{session}"
            config = {"bootstrap.servers": self.bootstrap, "transactional.id": f"chaos-{self.name}",
                      "client.id": producer_name, "linger.ms": 5,
                      "transaction.timeout.ms": 60000, "message.timeout.ms": 30000,
                      "logger": CLIENT_LOG}
            producer = Producer(config)
            self.history.record("producer", producer=producer_name, client="confluent-kafka",
                                idempotent=True, acks="all", transactional=True)
            try:
                self._init(producer)
                self._transactions(producer, producer_name)
            except KafkaException as exc:  # fatal (fenced, or a state the client gives up on)
                self.history.record("producer_closed", producer=producer_name,
                                    fatal=str(exc.args[0]))
            try:
                producer.flush(5)
            except KafkaException:  # a producer in a fatal state raises it again here
                pass
            session += 1

    def _init(self, producer: Any) -> None:
        from confluent_kafka import KafkaException

        while not self.stopping.is_set():
            try:
                producer.init_transactions(30)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
                time.sleep(0.5)

    def _transactions(self, producer: Any, producer_name: str) -> None:
        from confluent_kafka import KafkaException

        pacer = Pacer(self.rate / self.size)
        seq = 0
        while not self.stopping.is_set():
            txn = f"{producer_name}-t{seq}"
            producer.begin_transaction()
            self.history.record("txn_begin", producer=producer_name, txn=txn)
            outcome, error = "commit", None
            try:
                for i in range(self.size):
                    message_id = f"{txn}-{i}"
                    self.history.record("txn_send", producer=producer_name, txn=txn,
                                        id=message_id)
                    while True:
                        try:
                            producer.produce(self.topic, key=message_id.encode(),
                                             value=message_id.encode())
                            break
                        except BufferError:
                            producer.poll(0.1)
                    producer.poll(0)
                if self.rng.random() < 0.2:
                    outcome = "abort"
                    producer.abort_transaction(30)
                else:
                    outcome = self._commit(producer)
            except KafkaException as exc:
                err = exc.args[0]
                error = str(err)
                if err.txn_requires_abort():
                    outcome = self._abort(producer)
                else:
                    self.history.record("txn_end", producer=producer_name, txn=txn,
                                        outcome="unknown", error=error)
                    raise
            self.history.record("txn_end", producer=producer_name, txn=txn, outcome=outcome,
                                error=error)
            seq += 1
            pacer.wait()

    def _commit(self, producer: Any) -> str:
        """commit_transaction, retried while librdkafka says it may be (its documented
        contract: a retriable error leaves the commit to be retried)."""
        from confluent_kafka import KafkaException

        while True:
            try:
                producer.commit_transaction(30)
                return "commit"
            except KafkaException as exc:
                if not exc.args[0].retriable() or self.stopping.is_set():
                    raise
                time.sleep(0.2)

    def _abort(self, producer: Any) -> str:
        from confluent_kafka import KafkaException

        while True:
            try:
                producer.abort_transaction(30)
                return "abort"
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
                time.sleep(0.2)


class GroupConsumer(Worker):
    """A confluent-kafka group member: reads, and commits its position every second
    (synchronously, so that each commit's outcome is known)."""

    def __init__(self, name: str, history: History, bootstrap: str, topic: str,
                 group: str) -> None:
        super().__init__(name, history)
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.positions: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self.read_up_to: dict[int, int] = {}  # next offset after the highest read, ever
        self.read_count = 0

    def work(self) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        history = self.history
        config = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "client.id": self.name,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
            "logger": CLIENT_LOG,
        }
        if os.environ.get("CHAOS_RDKAFKA_CONSUMER_DEBUG"):  # e.g. "cgrp,protocol"
            config["debug"] = os.environ["CHAOS_RDKAFKA_CONSUMER_DEBUG"]
            del config["logger"]  # to stderr from librdkafka's threads, even while blocked
        consumer = Consumer(config)

        def on_assign(c: Any, partitions: list) -> None:
            history.record("assign", consumer=self.name, partitions=[p.partition for p in partitions])

        def on_revoke(c: Any, partitions: list) -> None:
            history.record("revoke", consumer=self.name, partitions=[p.partition for p in partitions])
            for p in partitions:
                self.positions.pop(p.partition, None)
                self.committed.pop(p.partition, None)

        consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
        last_commit = time.monotonic()
        try:
            while not self.stopping.is_set():
                for msg in consumer.consume(200, timeout=0.5):
                    if msg.error():
                        history.record("consumer_error", consumer=self.name, error=str(msg.error()))
                        continue
                    history.record("read", consumer=self.name, partition=msg.partition(),
                                   offset=msg.offset(), id=msg.value().decode())
                    self.positions[msg.partition()] = msg.offset() + 1
                    self.read_up_to[msg.partition()] = max(self.read_up_to.get(msg.partition(), 0),
                                                           msg.offset() + 1)
                    self.read_count += 1
                if time.monotonic() - last_commit >= 1.0:
                    last_commit = time.monotonic()
                    todo = {p: o for p, o in self.positions.items() if self.committed.get(p) != o}
                    if not todo:
                        continue
                    sent = history.now()
                    history.record("commit_sent", consumer=self.name, offsets=todo)
                    try:
                        result = consumer.commit(offsets=[TopicPartition(self.topic, p, o)
                                                          for p, o in todo.items()],
                                                 asynchronous=False)
                    except KafkaException as exc:
                        history.record("commit_fail", consumer=self.name, error=str(exc),
                                       sent=sent)
                        continue
                    for tp in result or ():
                        if tp.error:
                            history.record("commit_fail", consumer=self.name,
                                           partition=tp.partition, error=str(tp.error), sent=sent)
                        else:
                            history.record("commit", consumer=self.name, partition=tp.partition,
                                           offset=tp.offset, sent=sent)
                            self.committed[tp.partition] = tp.offset
        finally:
            consumer.close()


def final_read(history: History, bootstrap: str, topic: str, partitions: int,
               timeout: float = 300.0, stall_timeout: float = 120.0,
               hard_limit: float = 1800.0, label: str = "") -> bool:
    """Read every partition from offset 0 up to its high watermark; True if complete.

    One consumer per partition, in parallel: reading old data costs the leaders one ranged
    GET per committed range, so the partitions' leaders are kept busy side by side.
    Its events are `final`, `watermark` and `final_done`, prefixed with `label` (`txn_` for
    the transactional topic).
    It gives up when no partition has moved for `stall_timeout` seconds after `timeout`
    (a slow read on a loaded machine is not a failure; a stuck one is), or at `hard_limit`."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    started = time.monotonic()
    deadline = started + timeout
    last_progress = [started]

    def reading_on() -> bool:
        now = time.monotonic()
        if now < deadline:
            return True
        return now - last_progress[0] < stall_timeout and now - started < hard_limit

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-final-read",
                      "logger": CLIENT_LOG})
    high: dict[int, int] = {}
    try:
        for p in range(partitions):
            while True:
                try:
                    low, hi = probe.get_watermark_offsets(TopicPartition(topic, p),
                                                          timeout=10, cached=False)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
            high[p] = hi
            history.record(f"{label}watermark", partition=p, low=low, high=hi)
    finally:
        probe.close()
    position = {p: 0 for p in range(partitions)}

    def read_partition(p: int) -> None:
        consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-final-read",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "logger": CLIENT_LOG,
        })
        try:
            consumer.assign([TopicPartition(topic, p, 0)])
            while position[p] < high[p] and reading_on():
                for msg in consumer.consume(500, timeout=1.0):
                    if msg.error():
                        history.record("consumer_error", consumer=f"final-{p}",
                                       error=str(msg.error()))
                        continue
                    history.record(f"{label}final", partition=msg.partition(), offset=msg.offset(),
                                   id=msg.value().decode(), leader_epoch=msg.leader_epoch())
                    position[p] = max(position[p], msg.offset() + 1)
                    last_progress[0] = time.monotonic()
                # read_committed: the consumer's position moves past control batches and
                # aborted records, which are never delivered (a log often ends in a marker)
                at = consumer.position([TopicPartition(topic, p)])[0].offset
                if at > position[p]:
                    position[p] = at
                    last_progress[0] = time.monotonic()
        finally:
            consumer.close()

    readers = [threading.Thread(target=read_partition, args=(p,), daemon=True,
                                name=f"final-read-{p}") for p in range(partitions)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(max(1.0, started + hard_limit - time.monotonic() + 30))
    missing = [p for p in position if position[p] < high[p]]
    history.record(f"{label}final_done", complete=not missing, missing=missing,
                   high={str(p): h for p, h in high.items()},
                   reached={str(p): position[p] for p in position})
    return not missing
