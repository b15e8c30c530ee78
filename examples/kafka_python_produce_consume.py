"""Produce and consume with kafka-python against `mink dev` (make run).

    .venv/bin/python examples/kafka_python_produce_consume.py [bootstrap]
"""

import sys

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

bootstrap = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092"
topic = "example-kafka-python"

# kafka-python 3 turns idempotence on by default; Mink's idempotent producer is still to come.
producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
for i in range(10):
    producer.send(topic, key=f"key-{i}".encode(), value=f"hello {i}".encode())
producer.flush()
producer.close()
print(f"produced 10 messages to {topic}")

consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, consumer_timeout_ms=5000)
consumer.assign([TopicPartition(topic, 0)])
consumer.seek_to_beginning()
for message in consumer:
    print(f"offset {message.offset}: {message.key.decode()} = {message.value.decode()}")
consumer.close()
