"""ACLs and the authorizer (issue 24): CreateAcls, DescribeAcls and DeleteAcls with
confluent-kafka's and kafka-python's admin clients, and the checks of the handlers, with real
clients over real sockets against a node whose SASL_PLAINTEXT listener names the principal.

The node's PLAINTEXT listener is ANONYMOUS, made a super user here so the tests set up users
and ACLs through it; alice and bob log in with SASL PLAIN on the SASL_PLAINTEXT listener.
"""

from __future__ import annotations

import time

from contextlib import asynccontextmanager

import pytest
import trio
from kio.index import load_request_schema

from mink.client import ClientSecurity, KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build
from tests.support.security import create_users, endpoints

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"
SECURED = dict(listeners=LISTENERS, authorizer_enabled=True,
               super_users="User:ANONYMOUS;User:root",
               connection_failed_authentication_delay_ms=10)


@pytest.fixture
async def secured(mink_postgres, store_url):
    """A node with the authorizer on; yields listener name -> address."""
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         **SECURED) as running:
        where = endpoints(running)
        await trio.to_thread.run_sync(create_users, where["PLAINTEXT"], USERS)
        yield where


def user_conf(address: str, user: str = "alice") -> dict:
    return {"bootstrap.servers": address, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": USERS[user]}


@asynccontextmanager
async def as_user(address: str, user: str = "alice"):
    """Mink's own client logged in as `user` (SASL PLAIN): for the exact codes of raw
    requests."""
    security = ClientSecurity(protocol="SASL_PLAINTEXT", mechanism="PLAIN", username=user,
                              password=USERS[user])
    async with await KafkaClient.connect(address, client_id=f"test-{user}",
                                         security=security) as client:
        yield client


async def call(client: KafkaClient, api_key: int, version: int, **fields):
    return await client.call(api_key, version, build(load_request_schema(api_key, version),
                                                     **fields))


def binding(resource_type, name, principal, operation, permission="ALLOW",
            pattern="LITERAL", host="*"):
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kind = {"CLUSTER": "BROKER"}.get(resource_type, resource_type)  # librdkafka calls it BROKER
    return AclBinding(ResourceType[kind], name, ResourcePatternType[pattern],
                      principal, host, AclOperation[operation],
                      AclPermissionType[permission])


def create_acls(address: str, bindings, conf: dict | None = None) -> None:
    """Blocking: CreateAcls through confluent-kafka's AdminClient; raises on any error."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(conf or {"bootstrap.servers": address})
    for future in admin.create_acls(bindings, request_timeout=20).values():
        future.result(timeout=30)


def describe_all(address: str, conf: dict | None = None):
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient(conf or {"bootstrap.servers": address})
    return admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY), request_timeout=20).result(timeout=30)


def kafka_error_code(exc: BaseException) -> int:
    from confluent_kafka import KafkaException

    assert isinstance(exc, KafkaException), repr(exc)
    return exc.args[0].code()


# -- the ACL APIs -----------------------------------------------------------------------------

async def test_acls_created_described_deleted_with_confluent_admin(secured):
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    address = secured["PLAINTEXT"]
    made = [binding("TOPIC", "orders", "User:alice", "READ"),
            binding("TOPIC", "logs-", "User:alice", "WRITE", pattern="PREFIXED"),
            binding("GROUP", "*", "User:bob", "READ", "DENY", host="10.0.0.1"),
            binding("CLUSTER", "kafka-cluster", "User:bob", "DESCRIBE")]

    def run():
        create_acls(address, made)
        create_acls(address, made[:1])  # an existing binding is a success, stored once
        described = describe_all(address)
        admin = AdminClient({"bootstrap.servers": address})
        # MATCH: every binding that applies to the topic logs-app
        matched = admin.describe_acls(AclBindingFilter(
            ResourceType.TOPIC, "logs-app", ResourcePatternType.MATCH, None, None,
            AclOperation.ANY, AclPermissionType.ANY)).result(timeout=30)
        deleted = admin.delete_acls([AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None,
            AclOperation.ANY, AclPermissionType.ANY)], request_timeout=20)
        deleted = [list(f.result(timeout=30)) for f in deleted.values()]
        return described, matched, deleted, describe_all(address)

    described, matched, deleted, after = await trio.to_thread.run_sync(run)
    assert sorted(map(str, described)) == sorted(map(str, made))
    assert [str(b) for b in matched] == [str(made[1])]
    assert sorted(map(str, deleted[0])) == sorted(map(str, made[2:]))
    assert sorted(map(str, after)) == sorted(map(str, made[:2]))


async def test_invalid_acls_refused_with_invalid_request(secured):
    address = secured["PLAINTEXT"]

    def run(bad):
        try:
            create_acls(address, [bad])
        except Exception as exc:  # noqa: BLE001 - the code is what is checked
            return kafka_error_code(exc)
        return 0

    # a CLUSTER resource is called kafka-cluster; a principal has a type
    for bad in (binding("CLUSTER", "other", "User:alice", "ALTER"),
                binding("TOPIC", "t", "alice", "READ")):
        assert await trio.to_thread.run_sync(run, bad) == 42  # INVALID_REQUEST
    assert await trio.to_thread.run_sync(describe_all, address) == []


async def test_acl_apis_need_cluster_rights(secured):
    address = secured["SASL_PLAINTEXT"]
    creation = binding("TOPIC", "t", "User:alice", "READ")

    def create():
        try:
            create_acls(address, [creation], user_conf(address))
        except Exception as exc:  # noqa: BLE001
            return kafka_error_code(exc)
        return 0

    async def describe():
        async with as_user(address) as client:
            answer = await call(client, ApiKey.DESCRIBE_ACLS, 3, resource_type_filter=1,
                                resource_name_filter=None, pattern_type_filter=1,
                                principal_filter=None, host_filter=None, operation=1,
                                permission_type=1)
            return int(answer.error_code), len(answer.resources)

    assert await trio.to_thread.run_sync(create) == 31  # CLUSTER_AUTHORIZATION_FAILED
    assert await describe() == (31, 0)
    await trio.to_thread.run_sync(create_acls, secured["PLAINTEXT"], [
        binding("CLUSTER", "kafka-cluster", "User:alice", "ALTER")])
    # ALTER on the cluster allows CreateAcls, and implies DESCRIBE (DescribeAcls)
    assert await trio.to_thread.run_sync(create) == 0
    assert await describe() == (0, 2)


async def test_acl_apis_without_an_authorizer_answer_security_disabled(mink_postgres,
                                                                        store_url):
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False) as running:
        def create():
            try:
                create_acls(running.bootstrap, [binding("TOPIC", "t", "User:a", "READ")])
            except Exception as exc:  # noqa: BLE001
                return kafka_error_code(exc)
            return 0

        assert await trio.to_thread.run_sync(create) == 54  # SECURITY_DISABLED
        # (librdkafka's describe_acls drops the top-level error: asked raw)
        async with await KafkaClient.connect(running.bootstrap) as client:
            answer = await call(client, ApiKey.DESCRIBE_ACLS, 3, resource_type_filter=1,
                                resource_name_filter=None, pattern_type_filter=1,
                                principal_filter=None, host_filter=None, operation=1,
                                permission_type=1)
            assert answer.error_code == 54


async def test_acls_with_kafka_python_admin(secured):
    from kafka.admin import (
        ACLResourcePatternType,
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )


    def run():
        admin = KafkaAdminClient(bootstrap_servers=secured["PLAINTEXT"])
        try:
            acl = ACL("User:bob", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                      ResourcePattern(ResourceType.TOPIC, "kp-",
                                      ACLResourcePatternType.PREFIXED))
            created = admin.create_acls([acl])
            wanted = ACLFilter("User:bob", None, ACLOperation.ANY, ACLPermissionType.ANY,
                               ResourcePatternFilter(ResourceType.ANY, None,
                                                     ACLResourcePatternType.ANY))
            described, error = admin.describe_acls(wanted)
            deleted = admin.delete_acls([wanted])
            left, _ = admin.describe_acls(wanted)
            return created, described, error, deleted, left
        finally:
            admin.close()

    created, described, error, deleted, left = await trio.to_thread.run_sync(run)
    assert not created["failed"] and len(created["succeeded"]) == 1
    assert error.errno == 0
    assert [(a.principal, a.operation, a.resource_pattern.resource_name) for a in described] \
        == [("User:bob", 3 + 1, "kp-")]
    ((_, matches, filter_error),) = deleted
    assert filter_error.errno == 0 and len(matches) == 1
    assert left == []


# -- the checks of the handlers, one row per API (Kafka's "Operations and Resources on
#    Protocols") -------------------------------------------------------------------------------

def _req(api_key: int, version: int, **fields):
    return api_key, version, build(load_request_schema(api_key, version), **fields)


def _n(api_key: int, version: int, name: str):
    from mink.protocol.messages import nested

    return nested(load_request_schema(api_key, version), name)


def _metadata(topic):
    return _req(ApiKey.METADATA, 12, topics=(build(_n(3, 12, "MetadataRequestTopic"),
                                                   topic_id=None, name=topic),),
                allow_auto_topic_creation=False, include_topic_authorized_operations=False)


def _produce(topic):
    from tests.support.batches import records_batch, values
    from tests.support.raw import produce_request

    return ApiKey.PRODUCE, 9, produce_request(topic, 0, records_batch(values(2)))


def _fetch(topic):
    import datetime

    part = build(_n(1, 12, "FetchPartition"), partition=0, current_leader_epoch=-1,
                 fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                 partition_max_bytes=1 << 20)
    return _req(ApiKey.FETCH, 12, cluster_id=None, replica_id=-1,
                max_wait=datetime.timedelta(milliseconds=10), min_bytes=0, max_bytes=1 << 20,
                isolation_level=0, session_id=0, session_epoch=-1,
                topics=(build(_n(1, 12, "FetchTopic"), topic=topic, partitions=(part,)),),
                forgotten_topics_data=(), rack_id="")


def _list_offsets(topic):
    part = build(_n(2, 7, "ListOffsetsPartition"), partition_index=0,
                 current_leader_epoch=-1, timestamp=-1)
    return _req(ApiKey.LIST_OFFSETS, 7, replica_id=-1, isolation_level=0, topics=(
        build(_n(2, 7, "ListOffsetsTopic"), name=topic, partitions=(part,)),))


def _epoch_end(topic):
    part = build(_n(23, 4, "OffsetForLeaderPartition"), partition=0, current_leader_epoch=-1,
                 leader_epoch=0)
    return _req(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, replica_id=-2, topics=(
        build(_n(23, 4, "OffsetForLeaderTopic"), topic=topic, partitions=(part,)),))


def _create_topic(topic):
    import datetime

    return _req(ApiKey.CREATE_TOPICS, 7, topics=(build(
        _n(19, 7, "CreatableTopic"), name=topic, num_partitions=1, replication_factor=-1,
        assignments=(), configs=()),), timeout=datetime.timedelta(seconds=10),
        validate_only=False)


def _delete_topic(topic):
    import datetime

    return _req(ApiKey.DELETE_TOPICS, 6, topics=(build(
        _n(20, 6, "DeleteTopicState"), name=topic, topic_id=None),),
        timeout=datetime.timedelta(seconds=10))


def _find_group(group):
    return _req(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=(group,))


def _join(group):
    import datetime

    protocol = build(_n(11, 7, "JoinGroupRequestProtocol"), name="range", metadata=b"")
    return _req(ApiKey.JOIN_GROUP, 7, group_id=group,
                session_timeout=datetime.timedelta(seconds=10),
                rebalance_timeout=datetime.timedelta(seconds=10), member_id="",
                group_instance_id=None, protocol_type="consumer", protocols=(protocol,))


def _heartbeat(group):
    return _req(ApiKey.HEARTBEAT, 4, group_id=group, generation_id=1, member_id="m",
                group_instance_id=None)


def _commit(group, topic):
    part = build(_n(8, 8, "OffsetCommitRequestPartition"), partition_index=0,
                 committed_offset=0, committed_leader_epoch=-1, committed_metadata=None)
    return _req(ApiKey.OFFSET_COMMIT, 8, group_id=group, generation_id_or_member_epoch=-1,
                member_id="", group_instance_id=None, topics=(build(
                    _n(8, 8, "OffsetCommitRequestTopic"), name=topic, partitions=(part,)),))


def _offset_fetch(group):
    return _req(ApiKey.OFFSET_FETCH, 8, groups=(build(
        _n(9, 8, "OffsetFetchRequestGroup"), group_id=group, topics=None),),
        require_stable=False)


def _describe_group(group):
    return _req(ApiKey.DESCRIBE_GROUPS, 5, groups=(group,), include_authorized_operations=True)


def _delete_group(group):
    return _req(ApiKey.DELETE_GROUPS, 2, groups_names=(group,))


def _init_producer(transactional_id=None):
    import datetime

    return _req(ApiKey.INIT_PRODUCER_ID, 4, transactional_id=transactional_id,
                transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1,
                producer_epoch=-1)


def _describe_configs(topic):
    return _req(ApiKey.DESCRIBE_CONFIGS, 4, resources=(build(
        _n(32, 4, "DescribeConfigsResource"), resource_type=2, resource_name=topic,
        configuration_keys=None),), include_synonyms=False, include_documentation=False)


def _alter_configs(topic):
    config = build(_n(33, 2, "AlterableConfig"), name="retention.ms", value="100000")
    return _req(ApiKey.ALTER_CONFIGS, 2, resources=(build(
        _n(33, 2, "AlterConfigsResource"), resource_type=2, resource_name=topic,
        configs=(config,)),), validate_only=True)


def _incremental_alter_configs(topic):
    config = build(_n(44, 1, "AlterableConfig"), name="retention.ms", config_operation=0,
                   value="100000")
    return _req(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, resources=(build(
        _n(44, 1, "AlterConfigsResource"), resource_type=2, resource_name=topic,
        configs=(config,)),), validate_only=True)


def _group_config(group):
    config = build(_n(44, 1, "AlterableConfig"), name="consumer.session.timeout.ms",
                   config_operation=0, value="50000")
    return _req(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, resources=(build(
        _n(44, 1, "AlterConfigsResource"), resource_type=32, resource_name=group,
        configs=(config,)),), validate_only=True)


def _describe_quorum():
    return _req(ApiKey.DESCRIBE_QUORUM, 2, topics=(build(
        _n(55, 2, "TopicData"), topic_name="__cluster_metadata",
        partitions=(build(_n(55, 2, "PartitionData"), partition_index=0),)),))


def _list_config_resources():
    return _req(ApiKey.LIST_CONFIG_RESOURCES, 1, resource_types=())


def _broker_configs():
    return _req(ApiKey.DESCRIBE_CONFIGS, 4, resources=(build(
        _n(32, 4, "DescribeConfigsResource"), resource_type=4, resource_name="1",
        configuration_keys=None),), include_synonyms=False, include_documentation=False)


def _create_partitions(topic):
    import datetime

    return _req(ApiKey.CREATE_PARTITIONS, 3, topics=(build(
        _n(37, 3, "CreatePartitionsTopic"), name=topic, count=2, assignments=None),),
        timeout=datetime.timedelta(seconds=10), validate_only=True)


def _delete_records(topic):
    import datetime

    part = build(_n(21, 2, "DeleteRecordsPartition"), partition_index=0, offset=0)
    return _req(ApiKey.DELETE_RECORDS, 2, topics=(build(
        _n(21, 2, "DeleteRecordsTopic"), name=topic, partitions=(part,)),),
        timeout=datetime.timedelta(seconds=10))


def _describe_users():
    return _req(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, users=None)


def _describe_quotas():
    return _req(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, components=(), strict=False)


def _end_txn(transactional_id):
    return _req(ApiKey.END_TXN, 4, transactional_id=transactional_id, producer_id=1,
                producer_epoch=0, committed=True)


def _add_offsets(transactional_id, group):
    return _req(ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id=transactional_id,
                producer_id=1, producer_epoch=0, group_id=group)


def _consumer_group_describe(group):
    return _req(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, group_ids=(group,),
                include_authorized_operations=True)


def _describe_topic_partitions(topic):
    return _req(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, topics=(build(
        _n(75, 0, "TopicRequest"), name=topic),), response_partition_limit=100, cursor=None)


def _describe_producers(topic):
    return _req(ApiKey.DESCRIBE_PRODUCERS, 0, topics=(build(
        _n(61, 0, "TopicRequest"), name=topic, partition_indexes=(0,)),))


def _offset_delete(group, topic):
    part = build(_n(47, 0, "OffsetDeleteRequestPartition"), partition_index=0)
    return _req(ApiKey.OFFSET_DELETE, 0, group_id=group, topics=(build(
        _n(47, 0, "OffsetDeleteRequestTopic"), name=topic, partitions=(part,)),))


def _elect_leaders(topic):
    import datetime

    wanted = build(_n(43, 2, "TopicPartitions"), topic=topic, partitions=(0,))
    return _req(ApiKey.ELECT_LEADERS, 2, election_type=1, topic_partitions=(wanted,),
                timeout=datetime.timedelta(seconds=10))


def _add_partitions(transactional_id, topic):
    return _req(ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id=transactional_id,
                v3_and_below_producer_id=1, v3_and_below_producer_epoch=0,
                v3_and_below_topics=(build(_n(24, 3, "AddPartitionsToTxnTopic"), name=topic,
                                           partitions=(0,)),))


def _txn_offset_commit(transactional_id, group, topic):
    part = build(_n(28, 3, "TxnOffsetCommitRequestPartition"), partition_index=0,
                 committed_offset=0, committed_leader_epoch=-1, committed_metadata=None)
    return _req(ApiKey.TXN_OFFSET_COMMIT, 3, transactional_id=transactional_id,
                group_id=group, producer_id=1, producer_epoch=0, generation_id=-1,
                member_id="", group_instance_id=None, topics=(build(
                    _n(28, 3, "TxnOffsetCommitRequestTopic"), name=topic, partitions=(part,)),))


def _sync(group):
    return _req(ApiKey.SYNC_GROUP, 5, group_id=group, generation_id=1, member_id="m",
                group_instance_id=None, protocol_type="consumer", protocol_name="range",
                assignments=())


def _leave(group):
    return _req(ApiKey.LEAVE_GROUP, 4, group_id=group, members=(build(
        _n(13, 4, "MemberIdentity"), member_id="m", group_instance_id=None),))


def _list_groups():
    return _req(ApiKey.LIST_GROUPS, 5, states_filter=(), types_filter=())


def _listed_groups(response):
    """(error, the listed groups among those made for the ListGroups rows)."""
    return int(response.error_code), tuple(sorted(
        g.group_id for g in response.groups if g.group_id in LISTED_GROUPS))


def _consumer_heartbeat(group, topic):
    import datetime

    return _req(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, group_id=group,
                member_id=f"member-of-{group}", member_epoch=0, instance_id=None,
                rack_id=None, rebalance_timeout=datetime.timedelta(seconds=10),
                subscribed_topic_names=(topic,), subscribed_topic_regex=None,
                server_assignor=None, topic_partitions=())


def _describe_txn(transactional_id):
    return _req(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(transactional_id,))


def _txn_topics(response):
    """(error, the topics of the transaction's partitions the answer shows)."""
    (state,) = response.transaction_states
    return int(state.error_code), tuple(sorted(t.topic for t in state.topics))


def _list_txns():
    return _req(ApiKey.LIST_TRANSACTIONS, 1, state_filters=(), producer_id_filters=(),
                duration_filter=-1)


def _listed_txns(response):
    return int(response.error_code), tuple(sorted(
        t.transactional_id for t in response.transaction_states))


def _alter_users():
    upsertion = build(_n(51, 0, "ScramCredentialUpsertion"), name="carol", mechanism=1,
                      iterations=4096, salt=b"s" * 16, salted_password=b"p" * 32)
    return _req(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, deletions=(),
                upsertions=(upsertion,))


def _alter_quotas():
    entry = build(_n(49, 1, "EntryData"), entity=(build(
        _n(49, 1, "EntityData"), entity_type="client-id", entity_name="c1"),),
        ops=(build(_n(49, 1, "OpData"), key="producer_byte_rate", value=1024.0,
                   remove=False),))
    return _req(ApiKey.ALTER_CLIENT_QUOTAS, 1, entries=(entry,), validate_only=True)


def _alter_reassignments(topic):
    import datetime

    part = build(_n(45, 0, "ReassignablePartition"), partition_index=0, replicas=(1,))
    return _req(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0,
                timeout=datetime.timedelta(seconds=10), topics=(build(
                    _n(45, 0, "ReassignableTopic"), name=topic, partitions=(part,)),))


def _list_reassignments(topic):
    import datetime

    return _req(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0,
                timeout=datetime.timedelta(seconds=10), topics=(build(
                    _n(46, 0, "ListPartitionReassignmentsTopics"), name=topic,
                    partition_indexes=(0,)),))


def _describe_log_dirs():
    return _req(ApiKey.DESCRIBE_LOG_DIRS, 4, topics=None)


def _alter_log_dirs(topic):
    return _req(ApiKey.ALTER_REPLICA_LOG_DIRS, 2, dirs=(build(
        _n(34, 2, "AlterReplicaLogDir"), path="/mink/object-store/node-1", topics=(build(
            _n(34, 2, "AlterReplicaLogDirTopic"), name=topic, partitions=(0,)),)),))


def _describe_cluster():
    return _req(ApiKey.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=True,
                endpoint_type=1)


def _txn_code(response):
    return int(response.results_by_topic_v3_and_below[0].results_by_partition[0]
               .partition_error_code)


def _topic_code(response):
    return int(response.topics[0].error_code)


def _produce_code(response):
    return int(response.responses[0].partition_responses[0].error_code)


def _fetch_code(response):
    return int(response.responses[0].partitions[0].error_code)


def _partition_code(response):
    return int(response.topics[0].partitions[0].error_code)


# One row per check of Kafka's "Operations and Resources on Protocols" (KafkaApis,
# ControllerApis, AuthHelper, ConfigHelper): (what, request, grants, code_of, code refused,
# code once granted, given). `given` are grants made first (the checks Kafka makes before
# this one), so the refusal is this check's; `grants` are the row's own, the only ones that
# can turn the refusal into the answer once granted: every ACL of alice is removed after each
# row, so no row passes on an earlier row's grant.
TOPIC_AUTH, GROUP_AUTH, CLUSTER_AUTH, TXN_AUTH = 29, 30, 31, 53
TXN_TOPIC = "t-dtxn"  # the topic of the transaction the DescribeTransactions rows see
LISTED_GROUPS = ("g-list-a", "g-list-b")  # groups the ListGroups rows may see
LOG_DIR = "/mink/object-store/node-1"
CREATE_BIT, DESCRIBE_BIT = 1 << 5, 1 << 8  # KIP-430 bits of AclOperation CREATE, DESCRIBE


def _error_code(response):
    return int(response.error_code)


ROWS = [
    # KIP-679: an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on a
    # topic
    ("InitProducerId idempotent (cluster)", _init_producer(),
     [("CLUSTER", "kafka-cluster", "IDEMPOTENT_WRITE")], _error_code, CLUSTER_AUTH, 0),
    ("InitProducerId idempotent (WRITE on a topic)", _init_producer(),
     [("TOPIC", "t-produce", "WRITE")], _error_code, CLUSTER_AUTH, 0),
    ("InitProducerId transactional", _init_producer("tx-1"),
     [("TRANSACTIONAL_ID", "tx-1", "WRITE")], _error_code, TXN_AUTH, 0),
    ("Metadata describes", _metadata("t-meta"), [("TOPIC", "t-meta", "DESCRIBE")],
     _topic_code, TOPIC_AUTH, 0),
    # a topic that does not exist answers the same to whoever may not describe it
    ("Metadata of a missing topic", _metadata("t-missing"),
     [("TOPIC", "t-missing", "DESCRIBE")], _topic_code, TOPIC_AUTH, 3),
    ("Produce writes", _produce("t-produce"), [("TOPIC", "t-produce", "WRITE")],
     _produce_code, TOPIC_AUTH, 0),
    ("Fetch reads", _fetch("t-fetch"), [("TOPIC", "t-fetch", "READ")], _fetch_code,
     TOPIC_AUTH, 0),
    ("ListOffsets describes", _list_offsets("t-list"), [("TOPIC", "t-list", "DESCRIBE")],
     _partition_code, TOPIC_AUTH, 0),
    ("OffsetForLeaderEpoch describes", _epoch_end("t-epoch"),
     [("TOPIC", "t-epoch", "DESCRIBE")], _partition_code, TOPIC_AUTH, 0),
    ("CreateTopics creates (topic)", _create_topic("t-new"), [("TOPIC", "t-new", "CREATE")],
     lambda r: int(r.topics[0].error_code), TOPIC_AUTH, 0),
    ("CreateTopics creates (cluster)", _create_topic("t-new2"),
     [("CLUSTER", "kafka-cluster", "CREATE")], lambda r: int(r.topics[0].error_code),
     TOPIC_AUTH, 0),
    ("DeleteTopics deletes", _delete_topic("t-del"), [("TOPIC", "t-del", "DELETE")],
     lambda r: int(r.responses[0].error_code), TOPIC_AUTH, 0),
    ("FindCoordinator describes the group", _find_group("g-find"),
     [("GROUP", "g-find", "DESCRIBE")], lambda r: int(r.coordinators[0].error_code),
     GROUP_AUTH, 0),
    # MEMBER_ID_REQUIRED: joined as far as a first JoinGroup goes
    ("JoinGroup reads the group", _join("g-join"), [("GROUP", "g-join", "READ")],
     _error_code, GROUP_AUTH, 79),
    ("SyncGroup reads the group", _sync("g-sync"), [("GROUP", "g-sync", "READ")],
     _error_code, GROUP_AUTH, 25),  # UNKNOWN_MEMBER_ID
    ("Heartbeat reads the group", _heartbeat("g-hb"), [("GROUP", "g-hb", "READ")],
     _error_code, GROUP_AUTH, 25),  # UNKNOWN_MEMBER_ID
    ("LeaveGroup reads the group", _leave("g-leave"), [("GROUP", "g-leave", "READ")],
     _error_code, GROUP_AUTH, 0),  # (the member's own error: UNKNOWN_MEMBER_ID)
    # ListGroups refuses nothing: it lists the groups the principal may describe, or all
    # of them with DESCRIBE on the cluster
    ("ListGroups lists the groups it describes", _list_groups(),
     [("GROUP", "g-list-a", "DESCRIBE")], _listed_groups, (0, ()), (0, ("g-list-a",))),
    ("ListGroups lists every group with DESCRIBE on the cluster", _list_groups(),
     [("CLUSTER", "kafka-cluster", "DESCRIBE")], _listed_groups, (0, ()),
     (0, LISTED_GROUPS)),
    # KIP-848: READ on the group, then DESCRIBE on every subscribed topic
    ("ConsumerGroupHeartbeat reads the group", _consumer_heartbeat("g-cgh", "t-cgh"),
     [("GROUP", "g-cgh", "READ")], _error_code, GROUP_AUTH, TOPIC_AUTH),
    ("ConsumerGroupHeartbeat describes the subscribed topics",
     _consumer_heartbeat("g-cgh2", "t-cgh"), [("TOPIC", "t-cgh", "DESCRIBE")], _error_code,
     TOPIC_AUTH, 0, [("GROUP", "g-cgh2", "READ")]),
    ("OffsetCommit reads the group", _commit("g-commit", "t-commit"),
     [("GROUP", "g-commit", "READ")], _partition_code, GROUP_AUTH, TOPIC_AUTH),
    ("OffsetCommit reads the topic", _commit("g-commit", "t-commit"),
     [("TOPIC", "t-commit", "READ")], _partition_code, TOPIC_AUTH, 0,
     [("GROUP", "g-commit", "READ")]),
    ("OffsetFetch describes the group", _offset_fetch("g-ofetch"),
     [("GROUP", "g-ofetch", "DESCRIBE")], lambda r: int(r.groups[0].error_code),
     GROUP_AUTH, 0),
    ("DescribeGroups describes", _describe_group("g-desc"), [("GROUP", "g-desc", "DESCRIBE")],
     lambda r: int(r.groups[0].error_code), GROUP_AUTH, 0),
    ("DeleteGroups deletes", _delete_group("g-del"), [("GROUP", "g-del", "DELETE")],
     lambda r: int(r.results[0].error_code), GROUP_AUTH, 69),  # GROUP_ID_NOT_FOUND
    ("DescribeConfigs of a topic", _describe_configs("t-cfg"),
     [("TOPIC", "t-cfg", "DESCRIBE_CONFIGS")], lambda r: int(r.results[0].error_code),
     TOPIC_AUTH, 0),
    # broker configs: DESCRIBE_CONFIGS on the cluster (ConfigHelper)
    ("DescribeConfigs of a broker", _broker_configs(),
     [("CLUSTER", "kafka-cluster", "DESCRIBE_CONFIGS")],
     lambda r: int(r.results[0].error_code), CLUSTER_AUTH, 0),
    ("AlterConfigs of a topic", _alter_configs("t-cfg"), [("TOPIC", "t-cfg", "ALTER_CONFIGS")],
     lambda r: int(r.responses[0].error_code), TOPIC_AUTH, 0),
    ("IncrementalAlterConfigs of a topic", _incremental_alter_configs("t-cfg2"),
     [("TOPIC", "t-cfg2", "ALTER_CONFIGS")], lambda r: int(r.responses[0].error_code),
     TOPIC_AUTH, 0),
    ("ListConfigResources describes the cluster's configs", _list_config_resources(),
     [("CLUSTER", "kafka-cluster", "DESCRIBE_CONFIGS")], lambda r: int(r.error_code),
     CLUSTER_AUTH, 0),
    ("DescribeQuorum describes the cluster", _describe_quorum(),
     [("CLUSTER", "kafka-cluster", "DESCRIBE")], lambda r: int(r.error_code), CLUSTER_AUTH,
     0),
    # group configs: ALTER_CONFIGS on the group (Kafka's ConfigAdminManager)
    ("IncrementalAlterConfigs of a group", _group_config("g-cfg"),
     [("GROUP", "g-cfg", "ALTER_CONFIGS")], lambda r: int(r.responses[0].error_code),
     GROUP_AUTH, 0),
    ("CreatePartitions alters", _create_partitions("t-grow"), [("TOPIC", "t-grow", "ALTER")],
     lambda r: int(r.results[0].error_code), TOPIC_AUTH, 0),
    ("DeleteRecords deletes", _delete_records("t-records"),
     [("TOPIC", "t-records", "DELETE")], _partition_code, TOPIC_AUTH, 0),
    ("EndTxn writes the transactional id", _end_txn("tx-end"),
     [("TRANSACTIONAL_ID", "tx-end", "WRITE")], _error_code, TXN_AUTH,
     49),  # INVALID_PRODUCER_ID_MAPPING: no such transaction
    ("AddOffsetsToTxn writes the transactional id", _add_offsets("tx-end", "g-txn"),
     [("TRANSACTIONAL_ID", "tx-end", "WRITE")], _error_code, TXN_AUTH, GROUP_AUTH),
    ("AddOffsetsToTxn reads the group", _add_offsets("tx-end", "g-txn"),
     [("GROUP", "g-txn", "READ")], _error_code, GROUP_AUTH, 49,
     [("TRANSACTIONAL_ID", "tx-end", "WRITE")]),
    ("DescribeTransactions describes the transactional id", _describe_txn("tx-desc"),
     [("TRANSACTIONAL_ID", "tx-desc", "DESCRIBE")], lambda r: _txn_topics(r)[0], TXN_AUTH,
     0),
    # ... and shows only the partitions of topics the principal may describe
    ("DescribeTransactions shows the topics it describes", _describe_txn("tx-desc"),
     [("TOPIC", TXN_TOPIC, "DESCRIBE")], _txn_topics, (0, ()), (0, (TXN_TOPIC,)),
     [("TRANSACTIONAL_ID", "tx-desc", "DESCRIBE")]),
    # ListTransactions refuses nothing: it lists the transactional ids one may describe
    ("ListTransactions lists the transactional ids it describes", _list_txns(),
     [("TRANSACTIONAL_ID", "tx-desc", "DESCRIBE")], _listed_txns, (0, ()),
     (0, ("tx-desc",))),
    ("DescribeUserScramCredentials describes the cluster", _describe_users(),
     [("CLUSTER", "kafka-cluster", "DESCRIBE")], _error_code, CLUSTER_AUTH, 0),
    ("AlterUserScramCredentials alters the cluster", _alter_users(),
     [("CLUSTER", "kafka-cluster", "ALTER")], lambda r: int(r.results[0].error_code),
     CLUSTER_AUTH, 0),
    ("DescribeClientQuotas describes the cluster's configs", _describe_quotas(),
     [("CLUSTER", "kafka-cluster", "DESCRIBE_CONFIGS")], _error_code, CLUSTER_AUTH, 0),
    ("AlterClientQuotas alters the cluster's configs", _alter_quotas(),
     [("CLUSTER", "kafka-cluster", "ALTER_CONFIGS")],
     lambda r: int(r.entries[0].error_code), CLUSTER_AUTH, 0),
    ("ConsumerGroupDescribe describes", _consumer_group_describe("g-cdesc"),
     [("GROUP", "g-cdesc", "DESCRIBE")], lambda r: int(r.groups[0].error_code), GROUP_AUTH,
     69),  # GROUP_ID_NOT_FOUND
    ("DescribeTopicPartitions describes", _describe_topic_partitions("t-dtp"),
     [("TOPIC", "t-dtp", "DESCRIBE")], lambda r: int(r.topics[0].error_code), TOPIC_AUTH, 0),
    ("DescribeProducers reads", _describe_producers("t-dprod"),
     [("TOPIC", "t-dprod", "READ")], _partition_code, TOPIC_AUTH, 0),
    ("OffsetDelete deletes the group", _offset_delete("g-odel", "t-dprod"),
     [("GROUP", "g-odel", "DELETE")], _error_code, GROUP_AUTH, 69),
    ("ElectLeaders alters the cluster", _elect_leaders("t-dtp"),
     [("CLUSTER", "kafka-cluster", "ALTER")],
     lambda r: int(r.replica_election_results[0].partition_result[0].error_code),
     CLUSTER_AUTH, 84),  # ELECTION_NOT_NEEDED
    # the top-level code and the partition's (Kafka's getErrorResponse sets both)
    ("AlterPartitionReassignments alters the cluster", _alter_reassignments("t-reassign"),
     [("CLUSTER", "kafka-cluster", "ALTER")],
     lambda r: (int(r.error_code), int(r.responses[0].partitions[0].error_code)),
     (CLUSTER_AUTH, CLUSTER_AUTH), (0, 0)),
    # refused, the partitions asked for come back empty (Kafka's getErrorResponse);
    # granted, only those with a reassignment in progress: none
    ("ListPartitionReassignments describes the cluster", _list_reassignments("t-reassign"),
     [("CLUSTER", "kafka-cluster", "DESCRIBE")],
     lambda r: (int(r.error_code), [(t.name, [p.partition_index for p in t.partitions])
                                    for t in r.topics]),
     (CLUSTER_AUTH, [("t-reassign", [0])]), (0, [])),
    # v3+: a top-level code and no results; granted, the node's one log dir
    ("DescribeLogDirs describes the cluster", _describe_log_dirs(),
     [("CLUSTER", "kafka-cluster", "DESCRIBE")],
     lambda r: (int(r.error_code), len(r.results)), (CLUSTER_AUTH, 0), (0, 1)),
    ("AlterReplicaLogDirs alters the cluster", _alter_log_dirs("t-reassign"),
     [("CLUSTER", "kafka-cluster", "ALTER")],
     lambda r: int(r.results[0].partitions[0].error_code), CLUSTER_AUTH, 0),
    # DescribeCluster refuses nothing (AuthHelper.computeDescribeClusterResponse): without
    # DESCRIBE on the cluster the authorized operations are 0, whatever else is allowed
    ("DescribeCluster shows operations once it describes", _describe_cluster(),
     [("CLUSTER", "kafka-cluster", "DESCRIBE")],
     lambda r: (int(r.error_code), r.cluster_authorized_operations), (0, 0),
     (0, DESCRIBE_BIT)),
    ("DescribeCluster shows no operations without DESCRIBE", _describe_cluster(),
     [("CLUSTER", "kafka-cluster", "DESCRIBE")],
     lambda r: (int(r.error_code), r.cluster_authorized_operations), (0, 0),
     (0, CREATE_BIT | DESCRIBE_BIT), [("CLUSTER", "kafka-cluster", "CREATE")]),
    ("AddPartitionsToTxn writes the transactional id", _add_partitions("tx-add", "t-txn"),
     [("TRANSACTIONAL_ID", "tx-add", "WRITE")], _txn_code, TXN_AUTH, TOPIC_AUTH),
    ("AddPartitionsToTxn writes the topic", _add_partitions("tx-add", "t-txn"),
     [("TOPIC", "t-txn", "WRITE")], _txn_code, TOPIC_AUTH, 49,
     [("TRANSACTIONAL_ID", "tx-add", "WRITE")]),
    ("TxnOffsetCommit writes the transactional id", _txn_offset_commit("tx-toc", "g-toc",
                                                                       "t-txn2"),
     [("TRANSACTIONAL_ID", "tx-toc", "WRITE")], _partition_code, TXN_AUTH, GROUP_AUTH),
    ("TxnOffsetCommit reads the group", _txn_offset_commit("tx-toc", "g-toc", "t-txn2"),
     [("GROUP", "g-toc", "READ")], _partition_code, GROUP_AUTH, TOPIC_AUTH,
     [("TRANSACTIONAL_ID", "tx-toc", "WRITE")]),
    ("TxnOffsetCommit reads the topic", _txn_offset_commit("tx-toc", "g-toc", "t-txn2"),
     [("TOPIC", "t-txn2", "READ")], _partition_code, TOPIC_AUTH, 49,
     [("TRANSACTIONAL_ID", "tx-toc", "WRITE"), ("GROUP", "g-toc", "READ")]),
]
TOPICS = ("t-meta", "t-produce", "t-fetch", "t-list", "t-epoch", "t-del", "t-commit",
          "t-cfg", "t-cfg2", "t-grow", "t-records", "t-dtp", "t-dprod", "t-txn",
          "t-txn2", "t-cgh", TXN_TOPIC, "t-reassign")


async def _wait_code(client, request, code_of, expected, what, timeout=10.0):
    """The row's code, asked again until it is `expected` (a just-created topic may still be
    opening) or the time is up; the last code is returned."""
    api_key, version, body = request
    deadline = trio.current_time() + timeout
    while True:
        code = code_of(await client.call(api_key, version, body))
        if code == expected or trio.current_time() > deadline:
            return code
        await trio.sleep(0.1)


def _acl_creation(kind, name, operation):
    from mink.broker.security.acls import AclOperation, ResourceType

    return build(_n(ApiKey.CREATE_ACLS, 3, "AclCreation"), resource_type=ResourceType[kind],
                 resource_name=name, resource_pattern_type=3,  # LITERAL
                 principal="User:alice", host="*", operation=AclOperation[operation],
                 permission_type=3)  # ALLOW


async def _grant(admin: KafkaClient, grants) -> None:
    """CreateAcls as the super user: ALLOW alice each (type, name, operation)."""
    answer = await admin.call(ApiKey.CREATE_ACLS, 3, build(
        load_request_schema(ApiKey.CREATE_ACLS, 3),
        creations=tuple(_acl_creation(*g) for g in grants)))
    assert [int(r.error_code) for r in answer.results] == [0] * len(grants), answer


async def _revoke_alice(admin: KafkaClient, node) -> None:
    """DeleteAcls of every binding of alice, then her ACLs gone from the node's authorizer
    (it reloads them before answering; waited for all the same, bounded)."""
    answer = await admin.call(ApiKey.DELETE_ACLS, 3, build(
        load_request_schema(ApiKey.DELETE_ACLS, 3), filters=(build(
            _n(ApiKey.DELETE_ACLS, 3, "DeleteAclsFilter"), resource_type_filter=1,
            resource_name_filter=None, pattern_type_filter=1,  # ANY
            principal_filter="User:alice", host_filter=None, operation=1,
            permission_type=1),)))
    assert int(answer.filter_results[0].error_code) == 0, answer
    with trio.fail_after(5):
        while any(b.principal == "User:alice" for b in node.authorizer.index.bindings):
            await trio.sleep(0.02)


async def _prepare_rows(admin: KafkaClient) -> None:
    """As the super user: the groups the ListGroups rows may see (an offset committed
    outside any generation makes an empty group) and an ongoing transaction on TXN_TOPIC
    (tx-desc) for the DescribeTransactions and ListTransactions rows."""
    for group in LISTED_GROUPS:
        _, version, body = _commit(group, "t-commit")
        answer = await _wait_code(admin, (ApiKey.OFFSET_COMMIT, version, body),
                                  _partition_code, 0, group)
        assert answer == 0, f"commit for {group}: {answer}"
    _, version, body = _init_producer("tx-desc")
    deadline = trio.current_time() + 10
    while (init := await admin.call(ApiKey.INIT_PRODUCER_ID, version, body)).error_code:
        assert trio.current_time() < deadline, init  # the coordinator may be loading
        await trio.sleep(0.1)
    add = build(load_request_schema(ApiKey.ADD_PARTITIONS_TO_TXN, 3),
                v3_and_below_transactional_id="tx-desc",
                v3_and_below_producer_id=init.producer_id,
                v3_and_below_producer_epoch=init.producer_epoch,
                v3_and_below_topics=(build(_n(24, 3, "AddPartitionsToTxnTopic"),
                                           name=TXN_TOPIC, partitions=(0,)),))
    deadline = trio.current_time() + 10
    while (code := _txn_code(await admin.call(ApiKey.ADD_PARTITIONS_TO_TXN, 3, add))) != 0:
        assert trio.current_time() < deadline, f"AddPartitionsToTxn: {code}"
        await trio.sleep(0.1)


async def test_every_api_refuses_without_acls_and_serves_once_granted(mink_postgres,
                                                                      store_url):
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         **SECURED) as running:
        where = endpoints(running)
        await trio.to_thread.run_sync(create_users, where["PLAINTEXT"], USERS)
        for topic in TOPICS:
            await running.create_topic(topic)
        for topic in TOPICS:
            await running.wait_led(topic)
        async with await KafkaClient.connect(where["PLAINTEXT"]) as admin, \
                as_user(where["SASL_PLAINTEXT"]) as client:
            await _prepare_rows(admin)
            for what, request, grants, code_of, refused, granted, *given in ROWS:
                if given:
                    await _grant(admin, given[0])
                code = await _wait_code(client, request, code_of, refused, what)
                assert code == refused, f"{what}: without ACLs {code}, not {refused}"
                await _grant(admin, grants)
                code = await _wait_code(client, request, code_of, granted, what)
                assert code == granted, f"{what}: granted {code}, not {granted}"
                await _revoke_alice(admin, running.node)


# -- the rules, with the real clients ---------------------------------------------------------

def roundtrip(conf: dict, topic: str, group: str, count: int = 5,
              timeout: float = 20.0) -> tuple[list, list[bytes]]:
    """Blocking: an idempotent confluent-kafka producer writes `count` records, a consumer in
    `group` reads them back; (delivery errors, values read)."""
    from confluent_kafka import Consumer, Producer

    producer = Producer({**conf, "acks": "all", "enable.idempotence": True,
                         "message.timeout.ms": int(timeout * 1000 / 2)})
    errors: list = []
    for i in range(count):
        producer.produce(topic, b"v%d" % i, on_delivery=lambda e, m: e and errors.append(e))
    producer.flush(timeout)
    if errors:
        return errors, []
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            got.append(msg.value())
        elif msg is not None and msg.error().fatal():
            errors.append(msg.error())
            break
    consumer.close()
    return errors, got


async def _topic_codes(client, names, version=12) -> dict[str, int]:
    answer = await client.call(*_metadata_request(names, version))
    return {t.name: int(t.error_code) for t in answer.topics}


def _metadata_request(names, version=12):
    topics = None if names is None else tuple(
        build(_n(3, version, "MetadataRequestTopic"), topic_id=None, name=n) for n in names)
    return ApiKey.METADATA, version, build(
        load_request_schema(ApiKey.METADATA, version), topics=topics,
        allow_auto_topic_creation=False, include_topic_authorized_operations=True)


async def test_confluent_clients_refused_then_served_once_granted(secured):
    """Produce (idempotent: KIP-679 through WRITE on the topic), consume in a group."""
    address = secured["SASL_PLAINTEXT"]
    conf = user_conf(address)
    errors, got = await trio.to_thread.run_sync(roundtrip, conf, "orders", "g-orders", 5, 6.0)
    assert errors and not got
    assert {e.code() for e in errors} & {29, 31}, errors  # TOPIC_/CLUSTER_AUTHORIZATION_FAILED
    await trio.to_thread.run_sync(create_acls, secured["PLAINTEXT"], [
        binding("TOPIC", "orders", "User:alice", "WRITE"),
        binding("TOPIC", "orders", "User:alice", "READ"),
        binding("TOPIC", "orders", "User:alice", "CREATE"),
        binding("GROUP", "g-orders", "User:alice", "READ")])
    errors, got = await trio.to_thread.run_sync(roundtrip, conf, "orders", "g-orders")
    assert not errors and sorted(got) == [b"v%d" % i for i in range(5)]


async def test_super_user_needs_no_acls(secured):
    await trio.to_thread.run_sync(create_users, secured["PLAINTEXT"], {"root": "root-secret"})
    USERS["root"] = "root-secret"
    try:
        await trio.to_thread.run_sync(create_acls, secured["PLAINTEXT"], [
            binding("TOPIC", "*", "User:*", "ALL", "DENY")])  # super users are not asked
        errors, got = await trio.to_thread.run_sync(
            roundtrip, user_conf(secured["SASL_PLAINTEXT"], "root"), "root-topic", "g-root")
    finally:
        del USERS["root"]
    assert not errors and len(got) == 5


async def test_deny_beats_allow_and_prefixed_patterns(secured):
    plain = secured["PLAINTEXT"]
    # topics made by the super user over PLAINTEXT
    await trio.to_thread.run_sync(_create_topics, plain, ["logs-app", "logs-secret", "other"])
    await trio.to_thread.run_sync(create_acls, plain, [
        binding("TOPIC", "logs-", "User:alice", "READ", pattern="PREFIXED"),
        binding("TOPIC", "logs-secret", "User:alice", "READ", "DENY"),
        binding("TOPIC", "*", "User:bob", "DESCRIBE"),
        binding("TOPIC", "other", "User:bob", "DESCRIBE", "DENY", host="127.0.0.1")])
    names = ["logs-app", "logs-secret", "other"]
    async with as_user(secured["SASL_PLAINTEXT"], "alice") as alice:
        # READ implies DESCRIBE; a DENY of READ does not deny DESCRIBE
        assert await _topic_codes(alice, names) == {"logs-app": 0, "logs-secret": 0,
                                                    "other": TOPIC_AUTH}
        fetched = {t: _fetch_code(await alice.call(*_fetch(t))) for t in names}
        assert fetched == {"logs-app": 0, "logs-secret": TOPIC_AUTH, "other": TOPIC_AUTH}
        # Metadata of every topic lists only the describable ones
        listed = await _topic_codes(alice, None)
        assert set(listed) == {"logs-app", "logs-secret"}
        # KIP-430: the operations reported are the principal's
        answer = await alice.call(*_metadata_request(["logs-app", "logs-secret"]))
        ops = {t.name: t.topic_authorized_operations for t in answer.topics}
        assert ops == {"logs-app": (1 << 3) | (1 << 8), "logs-secret": 1 << 8}
    async with as_user(secured["SASL_PLAINTEXT"], "bob") as bob:
        # the literal wildcard allows, the DENY from bob's host beats it
        assert await _topic_codes(bob, names) == {"logs-app": 0, "logs-secret": 0,
                                                  "other": TOPIC_AUTH}


def _create_topics(address: str, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.create_topics([NewTopic(n, 1) for n in names]).values():
        future.result(timeout=30)


async def test_acls_act_on_every_node_within_two_seconds(mink_postgres, store_url):
    from mink.testing import open_cluster

    async with open_cluster(3, mink_postgres, store_url=store_url, proxy=False,
                            **SECURED) as cluster:
        where = [endpoints(n) for n in cluster.nodes]
        await trio.to_thread.run_sync(create_users, where[0]["PLAINTEXT"], USERS)
        await trio.to_thread.run_sync(_create_topics, where[0]["PLAINTEXT"], ["shared"])
        clients = []
        try:
            for w in where:
                clients.append(await KafkaClient.connect(w["SASL_PLAINTEXT"], security=(
                    ClientSecurity(protocol="SASL_PLAINTEXT", mechanism="PLAIN",
                                   username="alice", password=USERS["alice"]))))
            for client in clients:
                assert await _topic_codes(client, ["shared"]) == {"shared": TOPIC_AUTH}
            # granted through the first node's AdminClient
            await trio.to_thread.run_sync(create_acls, where[0]["PLAINTEXT"], [
                binding("TOPIC", "shared", "User:alice", "DESCRIBE")])
            granted_at = trio.current_time()
            for client in clients:
                while await _topic_codes(client, ["shared"]) != {"shared": 0}:
                    assert trio.current_time() - granted_at < 2.0, "not within 2 s"
                    await trio.sleep(0.05)
            # and taken away again, through another node
            await trio.to_thread.run_sync(_delete_all_acls, where[1]["PLAINTEXT"])
            revoked_at = trio.current_time()
            for client in clients:
                while await _topic_codes(client, ["shared"]) != {"shared": TOPIC_AUTH}:
                    assert trio.current_time() - revoked_at < 2.0, "not within 2 s"
                    await trio.sleep(0.05)
        finally:
            for client in clients:
                await client.aclose()


def _delete_all_acls(address: str) -> None:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.delete_acls([AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
            AclPermissionType.ANY)], request_timeout=20).values():
        future.result(timeout=30)


async def test_metadata_auto_creates_only_for_a_principal_allowed_to_create(secured):
    def request(name):
        return ApiKey.METADATA, 12, build(
            load_request_schema(ApiKey.METADATA, 12),
            topics=(build(_n(3, 12, "MetadataRequestTopic"), topic_id=None, name=name),),
            allow_auto_topic_creation=True, include_topic_authorized_operations=False)

    async with as_user(secured["SASL_PLAINTEXT"]) as alice:
        codes = await alice.call(*request("auto-x"))
        assert [int(t.error_code) for t in codes.topics] == [TOPIC_AUTH]
        await trio.to_thread.run_sync(create_acls, secured["PLAINTEXT"], [
            binding("TOPIC", "auto-x", "User:alice", "DESCRIBE")])
        codes = await alice.call(*request("auto-x"))
        assert [int(t.error_code) for t in codes.topics] == [3]  # UNKNOWN_TOPIC_OR_PARTITION
        await trio.to_thread.run_sync(create_acls, secured["PLAINTEXT"], [
            binding("TOPIC", "auto-", "User:alice", "CREATE", pattern="PREFIXED")])
        codes = await alice.call(*request("auto-x"))
        assert [int(t.error_code) for t in codes.topics] in ([0], [5])  # LEADER_NOT_AVAILABLE
    async with await KafkaClient.connect(secured["PLAINTEXT"]) as admin:
        assert await _topic_codes(admin, ["auto-x"]) in ({"auto-x": 0}, {"auto-x": 5})


async def test_the_forwarding_marker_gains_a_client_nothing(secured):
    """The client id nodes once forwarded with: alice sending it is checked as ever (the
    same on the inter-broker listener: tests/test_security_envelope.py)."""
    await trio.to_thread.run_sync(_create_topics, secured["PLAINTEXT"], ["marked"])
    security = ClientSecurity(protocol="SASL_PLAINTEXT", mechanism="PLAIN", username="alice",
                              password=USERS["alice"])
    async with await KafkaClient.connect(secured["SASL_PLAINTEXT"], client_id="mink-forwarded",
                                         security=security) as client:
        assert await _topic_codes(client, ["marked"]) == {"marked": TOPIC_AUTH}
        assert _delete_code(await client.call(*_delete_topic("marked"))) == TOPIC_AUTH
    async with await KafkaClient.connect(secured["PLAINTEXT"]) as admin:
        assert await _topic_codes(admin, ["marked"]) == {"marked": 0}


def _delete_code(response):
    return int(response.responses[0].error_code)


def _mink(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "mink.cli", *args], capture_output=True,
                          text=True, timeout=60)


async def test_mink_acls_add_list_remove(secured, tmp_path):
    """`mink acls` through the Kafka APIs: a grant made with it acts (alice may then
    describe the topic), is listed, and is removed; a user without ALTER on the cluster is
    refused; a node without an authorizer says so."""
    await trio.to_thread.run_sync(_create_topics, secured["PLAINTEXT"], ["cli-t"])
    admin = ("--bootstrap-server", secured["PLAINTEXT"])

    async def run(*args):
        return await trio.to_thread.run_sync(lambda: _mink("acls", *args))

    done = await run("add", *admin, "--allow-principal", "User:alice", "--operation", "describe",
                     "--operation", "READ", "--topic", "cli-", "--resource-pattern-type",
                     "prefixed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Added TOPIC:PREFIXED:cli- User:alice from * ALLOW DESCRIBE",
        "Added TOPIC:PREFIXED:cli- User:alice from * ALLOW READ"]
    async with as_user(secured["SASL_PLAINTEXT"]) as alice:
        assert await _topic_codes(alice, ["cli-t"]) == {"cli-t": 0}
    listed = await run("list", *admin, "--principal", "User:alice")
    assert listed.stdout.splitlines() == [
        "TOPIC:PREFIXED:cli- User:alice from * ALLOW DESCRIBE",
        "TOPIC:PREFIXED:cli- User:alice from * ALLOW READ"], listed.stderr
    # alice may not add ACLs
    config = tmp_path / "alice.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                      f"sasl.username=alice\nsasl.password={USERS['alice']}\n")
    refused = await run("add", "--bootstrap-server", secured["SASL_PLAINTEXT"],
                        "--command-config", str(config), "--allow-principal", "User:alice",
                        "--operation", "ALL", "--cluster")
    assert refused.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
    removed = await run("remove", *admin, "--allow-principal", "User:alice", "--operation",
                        "DESCRIBE", "--topic", "cli-", "--resource-pattern-type", "prefixed")
    assert removed.stdout.splitlines() == [
        "Removed TOPIC:PREFIXED:cli- User:alice from * ALLOW DESCRIBE"], removed.stderr
    assert (await run("list", *admin, "--topic", "cli-", "--resource-pattern-type",
                      "prefixed")).stdout.splitlines() == [
        "TOPIC:PREFIXED:cli- User:alice from * ALLOW READ"]
    assert (await run("remove", *admin)).stdout.splitlines() == [
        "Removed TOPIC:PREFIXED:cli- User:alice from * ALLOW READ"]
    assert (await run("list", *admin)).stdout.strip() == "No ACLs."


async def test_mink_acls_without_an_authorizer(mink_postgres, store_url):
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False) as running:
        done = await trio.to_thread.run_sync(lambda: _mink(
            "acls", "list", "--bootstrap-server", running.bootstrap))
    assert done.returncode == 1 and "SECURITY_DISABLED" in done.stderr, done.stderr
