"""A failover test with `mink_cluster`: kill the leader, the producer carries on, nothing is
lost or duplicated."""

import confluent_kafka
import pytest


@pytest.mark.mink(nodes=3)
def test_idempotent_producer_survives_a_killed_leader(mink_cluster):
    mink_cluster.create_topic("payments", partitions=3)
    producer = confluent_kafka.Producer({"bootstrap.servers": mink_cluster.bootstrap,
                                         "enable.idempotence": True,
                                         "message.timeout.ms": 60000})
    for i in range(100):
        producer.produce("payments", value=f"before-{i}", partition=i % 3)
    assert producer.flush(30) == 0

    victim = mink_cluster.leaders("payments")[0]
    mink_cluster.kill(victim)  # as after SIGKILL: its leases expire, others take over

    for i in range(100):
        producer.produce("payments", value=f"after-{i}", partition=i % 3)
    assert producer.flush(60) == 0
    assert victim not in mink_cluster.wait_led("payments").values()

    values = [m.value.decode() for m in mink_cluster.read_topic("payments")]
    expected = [f"before-{i}" for i in range(100)] + [f"after-{i}" for i in range(100)]
    assert sorted(values) == sorted(expected)  # nothing lost, nothing twice

    mink_cluster.restart(victim)  # back, on the same port, at a new epoch
    assert mink_cluster.node(victim).running
