"""Request bodies for tests that talk to a node with `mink.client.KafkaClient`."""

from __future__ import annotations

from kio.index import load_request_schema

from mink.protocol.messages import build, nested


def produce_request(topic: str, partition: int, records: bytes, version: int = 9,
                    acks: int = -1, timeout_s: float = 10.0):
    import datetime

    schema = load_request_schema(0, version)
    partition_data = build(nested(schema, "PartitionProduceData"), index=partition,
                           records=records)
    topic_data = build(nested(schema, "TopicProduceData"), name=topic,
                       partition_data=(partition_data,))
    return build(schema, transactional_id=None, acks=acks,
                 timeout=datetime.timedelta(seconds=timeout_s), topic_data=(topic_data,))


def init_producer_id_request(version: int = 4, producer_id: int = -1, epoch: int = -1):
    import datetime

    return build(load_request_schema(22, version), transactional_id=None,
                 transaction_timeout=datetime.timedelta(seconds=60), producer_id=producer_id,
                 producer_epoch=epoch)


def produce_result(response) -> tuple[int, int]:
    """(error code, base offset) of a one-partition Produce response."""
    partition = response.responses[0].partition_responses[0]
    return int(partition.error_code), partition.base_offset
