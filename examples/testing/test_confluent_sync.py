"""A plain (sync) test with confluent-kafka: the `mink_broker` fixture gives a fresh node."""

import confluent_kafka
import confluent_kafka.admin


def test_produce_then_consume_in_a_group(mink_broker):
    mink_broker.create_topic("orders", partitions=3)

    producer = confluent_kafka.Producer({"bootstrap.servers": mink_broker.bootstrap,
                                         "enable.idempotence": True})
    for i in range(30):
        producer.produce("orders", key=f"customer-{i % 5}", value=f"order-{i}")
    assert producer.flush(15) == 0

    consumer = confluent_kafka.Consumer({"bootstrap.servers": mink_broker.bootstrap,
                                         "group.id": "billing", "auto.offset.reset": "earliest"})
    consumer.subscribe(["orders"])
    seen = []
    try:
        while len(seen) < 30:
            message = consumer.poll(10)
            assert message is not None, "no message within 10 s"
            assert message.error() is None, message.error()
            seen.append(message.value().decode())
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"order-{i}" for i in range(30))

    # What the broker committed, read directly (not through a client): per key, in order.
    committed = mink_broker.read_topic("orders")
    for key in {m.key for m in committed}:
        values = [int(m.value.split(b"-")[1]) for m in committed if m.key == key]
        assert values == sorted(values)


def test_every_test_gets_a_fresh_broker(mink_broker):
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": mink_broker.bootstrap})
    assert "orders" not in admin.list_topics(timeout=10).topics
