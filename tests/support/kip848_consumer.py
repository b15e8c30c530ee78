"""A confluent-kafka consumer with group.protocol=consumer, as a subprocess for the tests of
KIP-848 consumer groups: one JSON line per event on stdout (assigned, revoked, a message
consumed, then synchronously committed; a commit that failed); SIGTERM closes it (leaving the group), SIGKILL does
not. Arguments: bootstrap group topic [extra librdkafka settings as key=value]."""

import json
import logging
import os
import signal
import sys
import time

from confluent_kafka import Consumer, KafkaException

bootstrap, group, topic, *extra = sys.argv[1:]
stopping = False


def on_term(signum, frame):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, on_term)


def emit(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
        "enable.auto.commit": False, "auto.offset.reset": "earliest"}
conf.update(item.split("=", 1) for item in extra)
if os.environ.get("KIP848_DEBUG_LOG"):  # librdkafka's group debug log, for a failing test
    debug_log = logging.getLogger("librdkafka")
    handler = logging.FileHandler(os.environ["KIP848_DEBUG_LOG"])
    handler.setFormatter(logging.Formatter("%(created).3f %(message)s"))
    debug_log.addHandler(handler)
    debug_log.setLevel(logging.DEBUG)
    conf.update({"debug": "cgrp,topic", "logger": debug_log})
consumer = Consumer(conf)
consumer.subscribe(
    [topic],  # a regular expression when it starts with ^
    on_assign=lambda c, ps: emit(event="assigned", partitions=[p.partition for p in ps],
                                 topic_partitions=[[p.topic, p.partition] for p in ps]),
    on_revoke=lambda c, ps: emit(event="revoked", partitions=[p.partition for p in ps],
                                 topic_partitions=[[p.topic, p.partition] for p in ps]),
    on_lost=lambda c, ps: emit(event="lost", partitions=[p.partition for p in ps],
                               topic_partitions=[[p.topic, p.partition] for p in ps]))
emit(event="started", member=None)
while not stopping:
    msg = consumer.poll(0.1)
    if msg is None:
        continue
    if msg.error():
        emit(event="error", error=str(msg.error()))
        continue
    # consumed (processed) first, then committed synchronously: a consumer killed between
    # the two has its last message read again by the partition's next owner
    emit(event="message", topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
         value=msg.value().decode())
    for attempt in range(30):
        try:
            consumer.commit(message=msg, asynchronous=False)
            break
        except KafkaException as exc:
            # e.g. STALE_MEMBER_EPOCH while a new epoch is on its way: commit again
            error = str(exc)
            emit(event="commit_retry", partition=msg.partition(), offset=msg.offset(),
                 error=error)
            time.sleep(0.1)
    else:
        emit(event="commit_failed", partition=msg.partition(), offset=msg.offset(),
             error=error)
consumer.close()
emit(event="closed")
