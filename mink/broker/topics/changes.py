"""Changing a live topic's settings (AlterConfigs, IncrementalAlterConfigs): validated as at
creation, stored with a compare-and-set on the config read (two concurrent changes never
lose one), carried to every node by the view. Nothing is cached elsewhere: every use reads
the view's config (`effective_topic_setting`), so a change applies without a restart."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from mink.broker.topics.config import InvalidConfig
from mink.protocol.topics import topic_name_error
from mink.storage import controlplane as md
from mink.storage.lifecycle.store import ConfigChanged, alter_topic_config, topic_config

log = logging.getLogger(__name__)

# Kafka's ConfigResource.Type.
TOPIC, BROKER_LOGGER = 2, 8

_ATTEMPTS = 5


async def change_topic_config(node, name: str,
                              compute: Callable[[dict[str, str]], dict[str, str]],
                              validate_only: bool) -> tuple[ErrorCode, str | None]:
    """Apply `compute` (current stored config -> new stored config; raises InvalidConfig)
    to topic `name`. Returns the error code and message to answer."""
    problem = topic_name_error(name)
    if problem:
        return ErrorCode.invalid_topic_exception, problem
    try:
        for _ in range(_ATTEMPTS):
            current = await topic_config(node.metadata, name)
            if current is None:
                return ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist."
            try:
                new = compute({k: str(v) for k, v in current.items()})
            except InvalidConfig as exc:
                return ErrorCode.invalid_config, str(exc)
            if validate_only:
                return ErrorCode.none, None
            try:
                await alter_topic_config(node.metadata, name, current, new)
            except ConfigChanged:
                continue
            except md.UnknownTopic:
                return ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist."
            log.info("topic %s config changed to %s", name, new)
            try:
                await node.sync.refresh_view()
            except md.MetadataUnavailable as exc:  # stored; the sync loop catches up
                log.warning("view refresh after a config change failed: %s", exc)
            return ErrorCode.none, None
        return ErrorCode.request_timed_out, "the topic's config kept changing; retry"
    except md.MetadataUnavailable as exc:
        return ErrorCode.request_timed_out, f"the metadata store is unavailable: {exc}"


def refuse_non_topic(resource_type: int, name: str) -> tuple[ErrorCode, str]:
    """Config resources that cannot be changed on Mink (broker configs are changed by
    `mink/broker/dynamic_configs.py`)."""
    if resource_type == BROKER_LOGGER:
        return ErrorCode.invalid_request, "broker loggers cannot be changed on Mink"
    return ErrorCode.invalid_request, f"Unsupported resource type: {resource_type}"
