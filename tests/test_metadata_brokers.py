"""Metadata's broker list through a membership lapse: a node not live any more stays listed
for the listing grace (never as a leader), so clients do not tear down its connection on
every PostgreSQL blip; it goes once the grace has passed."""

from __future__ import annotations

import trio
from confluent_kafka.admin import AdminClient

from mink.broker.node import run_node
from tests.support.nodes import node_config


async def test_a_lapsed_node_stays_listed_for_the_grace_but_never_leads(pg_url, store_url,
                                                                        nursery):
    nodes: dict[int, object] = {}
    scopes: dict[int, trio.CancelScope] = {}

    async def run(config, task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            scopes[config.node_id] = scope
            await run_node(config, freeze_heap=False,
                           on_started=lambda n: nodes.__setitem__(n.node_id, n),
                           task_status=task_status)

    addresses = []
    for node_id in (1, 2):
        host, port = await nursery.start(run, node_config(
            pg_url, store_url, node_id=node_id, lease_ttl=3.0, coordinator_tick=0.5,
            num_partitions=4, offsets_topic_num_partitions=1))
        addresses.append(f"{host}:{port}")

    def create_topic():
        from confluent_kafka.admin import NewTopic

        admin = AdminClient({"bootstrap.servers": ",".join(addresses)})
        admin.create_topics([NewTopic("listed", 4)])["listed"].result(30)

    await trio.to_thread.run_sync(create_topic)

    def metadata():
        admin = AdminClient({"bootstrap.servers": addresses[0]})
        cluster = admin.list_topics(timeout=10)
        leaders = {p.leader for t in cluster.topics.values() for p in t.partitions.values()}
        return set(cluster.brokers), leaders

    with trio.fail_after(30):  # both live, and node 2 leads some of the topic
        while set(nodes[1].view.brokers) != {1, 2} or 2 not in {
                p.leader for p in nodes[1].view.topics["listed"].partitions}:
            await trio.sleep(0.05)
    nodes[2].leave_on_stop = False  # as after SIGKILL: its membership lapses
    scopes[2].cancel()
    with trio.fail_after(30):
        while 2 in nodes[1].view.brokers:
            await trio.sleep(0.05)
    brokers, leaders = await trio.to_thread.run_sync(metadata)
    assert brokers == {1, 2}, "dropped from the broker list as soon as its membership lapsed"
    assert leaders <= {1, -1}, f"a broker that is not live named as a leader: {leaders}"

    nodes[1].sync.listing_grace = 0.5
    with trio.fail_after(30):
        while (await trio.to_thread.run_sync(metadata))[0] != {1}:
            await trio.sleep(0.2)


def test_the_controller_is_a_listed_broker_while_no_membership_is_live():
    # every node's membership lapsed together (PostgreSQL unreachable, a starved machine):
    # kafka-python's admin raises on controller -1 ("Failed to find active controller id!")
    from mink.broker.cluster.view import BrokerInfo, ClusterView

    listed = {2: BrokerInfo(2, "127.0.0.1", 9093), 3: BrokerInfo(3, "127.0.0.1", 9094)}
    lapsed = ClusterView(version=7, cluster_id="c", brokers={}, topics={}, coordinator=None,
                         listed_brokers=listed)
    assert lapsed.controller_id == 2
    live = ClusterView(version=8, cluster_id="c", brokers={3: listed[3]}, topics={},
                       coordinator=3, listed_brokers=listed)
    assert live.controller_id == 3
    assert ClusterView(version=1, cluster_id="c", brokers={}, topics={}).controller_id == -1
