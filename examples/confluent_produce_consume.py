"""Produce and consume with confluent-kafka against `mink dev` (make run).

    .venv/bin/python examples/confluent_produce_consume.py [bootstrap]
"""

import sys

from confluent_kafka import Consumer, Producer, TopicPartition

bootstrap = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092"
topic = "example-confluent"

producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd"})
for i in range(10):
    producer.produce(topic, key=f"key-{i}", value=f"hello {i}")
producer.flush(10)
print(f"produced 10 messages to {topic}")

consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "example",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
# assign() rather than subscribe(): consumer groups come with their own issue.
consumer.assign([TopicPartition(topic, 0, 0)])
seen = 0
while seen < 10:
    message = consumer.poll(5)
    if message is None:
        break
    if message.error():
        raise SystemExit(message.error())
    print(f"offset {message.offset()}: {message.key().decode()} = {message.value().decode()}")
    seen += 1
consumer.close()
