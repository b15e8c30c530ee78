"""Every advertised listener of every node is in PostgreSQL: a client on one listener is
told the other nodes' endpoints of that same listener (Metadata, FindCoordinator,
DescribeCluster), never another listener's."""

from __future__ import annotations

import trio
from kio.index import load_request_schema

from mink.protocol.apis import ApiKey
from mink.protocol.messages import build
from tests.support.security import create_users, endpoints, metadata, raw_client, sasl_plain


async def test_three_nodes_answer_with_the_listener_asked(mink_postgres):
    from mink.testing import open_cluster

    async with open_cluster(3, mink_postgres, proxy=False,
                            listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                            advertised_listeners="PLAINTEXT://127.0.0.1:0,"
                                                 "SASL_PLAINTEXT://localhost:0",
                            offsets_topic_num_partitions=3) as cluster:
        where = {n.node_id: endpoints(n) for n in cluster.nodes}
        assert all(e["SASL_PLAINTEXT"].startswith("localhost:") for e in where.values())
        await trio.to_thread.run_sync(create_users, where[1]["PLAINTEXT"], {"u": "p"})

        async def listed(client) -> dict[int, str]:
            with trio.fail_after(20):
                while True:  # until every node is in this node's view
                    meta = await metadata(client)
                    if len(meta.brokers) == 3:
                        return {b.node_id: f"{b.host}:{b.port}" for b in meta.brokers}
                    await trio.sleep(0.1)

        async with raw_client(where[1]["PLAINTEXT"]) as client:
            assert await listed(client) == {i: e["PLAINTEXT"] for i, e in where.items()}
        sasl = where[2]["SASL_PLAINTEXT"].replace("localhost", "127.0.0.1")
        async with raw_client(sasl) as client:
            assert (await sasl_plain(client, "u", "p")).error_code == 0
            assert await listed(client) == {i: e["SASL_PLAINTEXT"] for i, e in where.items()}
            with trio.fail_after(20):
                while True:
                    found = await client.call(ApiKey.FIND_COORDINATOR, 3, build(
                        load_request_schema(ApiKey.FIND_COORDINATOR, 3), key="grp",
                        key_type=0))
                    if found.error_code == 0:
                        break
                    await trio.sleep(0.2)
            assert f"{found.host}:{found.port}" == where[found.node_id]["SASL_PLAINTEXT"]
            described = await client.call(ApiKey.DESCRIBE_CLUSTER, 0, build(
                load_request_schema(ApiKey.DESCRIBE_CLUSTER, 0),
                include_cluster_authorized_operations=False))
            assert {b.broker_id: f"{b.host}:{b.port}" for b in described.brokers} == {
                i: e["SASL_PLAINTEXT"] for i, e in where.items()}


async def test_the_old_forwarding_marker_gains_nothing_on_any_listener(mink_postgres):
    """A client sending the client id nodes once forwarded with (`mink-forwarded`) gains no
    quota exemption, on the inter-broker listener either: forwarded requests come in
    Envelopes now."""
    from kio.schema.errors import ErrorCode

    from mink.testing import open_node
    from tests.test_quotas import alter, api_versions_for

    async with open_node(mink_postgres, proxy=False,
                         listeners="INTERNAL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
                         listener_security_protocol_map="INTERNAL:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                         inter_broker_listener_name="INTERNAL") as running:
        where = endpoints(running)
        assert running.bootstrap == where["INTERNAL"]
        assert await trio.to_thread.run_sync(alter, where["PLAINTEXT"], [
            ([("client-id", None)], [("request_percentage", 0.01, False)])]) == [
                (ErrorCode.none, None)]
        for listener in ("PLAINTEXT", "INTERNAL"):
            _, throttles, _ = await api_versions_for(where[listener], "mink-forwarded", 1.0)
            assert throttles, listener


async def test_kip951_leader_endpoints_name_the_listener_asked(mink_postgres):
    """A Produce to a node that does not lead the partition answers NOT_LEADER_OR_FOLLOWER
    with the leader's endpoint (KIP-951) on the listener the request came in on (produce
    forwarding off, else it would be forwarded); so does a follower's Fetch (v16+,
    node_endpoints), which a non-leader does not serve from a replica view as it serves a
    consumer's."""
    from kio.schema.errors import ErrorCode

    from mink.testing import open_cluster
    from tests.support.batches import records_batch, values
    from tests.support.raw import produce_request

    async with open_cluster(2, mink_postgres, proxy=False,
                            listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                            offsets_topic_num_partitions=1,
                            produce_forwarding=False) as cluster:
        where = {n.node_id: endpoints(n) for n in cluster.nodes}
        await trio.to_thread.run_sync(create_users, where[1]["PLAINTEXT"], {"u": "p"})
        await cluster.create_topic("t951", 2)
        leaders = cluster.leaders("t951")
        with trio.fail_after(20):  # every node sees both nodes
            while not all(len(n.node.view.brokers) == 2 for n in cluster.nodes):
                await trio.sleep(0.05)
        partition, leader = next(iter(leaders.items()))
        other = 2 if leader == 1 else 1
        async with raw_client(where[other]["SASL_PLAINTEXT"]) as client:
            assert (await sasl_plain(client, "u", "p")).error_code == 0
            response = await client.call(ApiKey.PRODUCE, 10, produce_request(
                "t951", partition, records_batch(values(1)), version=10))
            fetched = await client.call(ApiKey.FETCH, 16, _follower_fetch(
                cluster.nodes[0].node.view.topics["t951"].topic_id, partition, other))
        answer = response.responses[0].partition_responses[0]
        assert answer.error_code == ErrorCode.not_leader_or_follower
        assert answer.current_leader.leader_id == leader
        assert [(e.node_id, f"{e.host}:{e.port}") for e in response.node_endpoints] == [
            (leader, where[leader]["SASL_PLAINTEXT"])]
        (fetch_answer,) = fetched.responses[0].partitions
        assert fetch_answer.error_code == ErrorCode.not_leader_or_follower
        assert fetch_answer.current_leader.leader_id == leader
        assert [(e.node_id, f"{e.host}:{e.port}") for e in fetched.node_endpoints] == [
            (leader, where[leader]["SASL_PLAINTEXT"])]


def _follower_fetch(topic_id, partition: int, replica_id: int):
    """Fetch v16 (topics by id, KIP-951's node_endpoints) as the follower `replica_id`."""
    import datetime

    from mink.protocol.messages import nested

    schema = load_request_schema(ApiKey.FETCH, 16)
    wanted = build(nested(schema, "FetchPartition"), partition=partition,
                   current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                   log_start_offset=-1, partition_max_bytes=1 << 20)
    return build(schema, cluster_id=None, replica_state=build(
        nested(schema, "ReplicaState"), replica_id=replica_id, replica_epoch=-1),
        max_wait=datetime.timedelta(milliseconds=10), min_bytes=0, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, topics=(build(
            nested(schema, "FetchTopic"), topic_id=topic_id, partitions=(wanted,)),),
        forgotten_topics_data=(), rack_id="")


async def test_endpoints_are_written_only_by_the_current_registration(mink_postgres):
    from mink.storage.controlplane.security import set_node_endpoints
    from mink.testing import open_node

    async with open_node(mink_postgres, proxy=False,
                         listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"
                         ) as running:
        node = running.node
        epoch = node.membership.node_epoch
        stale = [("PLAINTEXT", "PLAINTEXT", "elsewhere", 1)]
        assert not await running.call(set_node_endpoints, node.metadata, 1, epoch - 1, stale)
        assert not await running.call(set_node_endpoints, node.metadata, 1, epoch + 1, stale)
        view = await running.call(node.metadata.view)
        assert [list(e) for e in view.nodes[0].endpoints] == sorted(
            [list(e) for e in node.endpoints])


async def test_forwarding_between_nodes_over_sasl_ssl(mink_postgres, tmp_path):
    """No PLAINTEXT listener at all: the nodes forward coordinator actions to each other over
    their SASL_SSL inter-broker listener, logged in as a SCRAM user; the forwarded request
    is answered."""
    import datetime

    from kio.schema.errors import ErrorCode

    from mink.client import ClientSecurity, KafkaClient
    from mink.protocol.messages import nested
    from mink.protocol.scram import SCRAM_SHA_512, new_credential
    from mink.storage.controlplane.security import upsert_credential
    from mink.testing import open_cluster
    from tests.support.tls import make_certs

    certs = make_certs(tmp_path / "certs")

    async with open_cluster(2, mink_postgres, proxy=False,
                            listeners="SASL_SSL://127.0.0.1:0",
                            ssl_cert_file=str(certs.server_cert),
                            ssl_key_file=str(certs.server_key), ssl_ca_file=str(certs.ca),
                            inter_broker_sasl_username="broker",
                            inter_broker_sasl_password="broker-pw",
                            offsets_topic_num_partitions=1) as cluster:
        first = cluster.nodes[0]
        for user, password in (("broker", "broker-pw"), ("admin", "admin-pw")):
            c = new_credential(SCRAM_SHA_512, password)
            await first.call(upsert_credential, first.node.metadata, (
                user, SCRAM_SHA_512.name, c.salt, c.stored_key, c.server_key, c.iterations))
        with trio.fail_after(20):
            while any(n.node.view.coordinator is None or len(n.node.view.brokers) < 2
                      for n in cluster.nodes):
                await trio.sleep(0.05)
        coordinator = first.node.view.coordinator
        other = next(n for n in cluster.nodes if n.node_id != coordinator)
        security = ClientSecurity("SASL_SSL", "SCRAM-SHA-512", "admin", "admin-pw",
                                  ca_file=str(certs.ca))
        schema = load_request_schema(ApiKey.CREATE_TOPICS, 5)
        body = build(schema, topics=(build(
            nested(schema, "CreatableTopic"), name="forwarded", num_partitions=2,
            replication_factor=-1, assignments=(), configs=()),),
            timeout=datetime.timedelta(seconds=20), validate_only=False)
        async with await KafkaClient.connect(endpoints(other)["SASL_SSL"],
                                             security=security) as client:
            response = await client.call(ApiKey.CREATE_TOPICS, 5, body)
        assert response.topics[0].error_code == ErrorCode.none, response
        with trio.fail_after(20):
            while "forwarded" not in other.node.view.topics:
                await trio.sleep(0.05)
