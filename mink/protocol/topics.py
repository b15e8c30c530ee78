"""Kafka's rules for topic names."""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 249
# Kafka's internal topic of consumer groups: its partitions' leaders coordinate the groups.
OFFSETS_TOPIC = "__consumer_offsets"
# Kafka's internal topic of transactions: its partitions' leaders coordinate transactional ids.
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def topic_name_error(name: str | None) -> str | None:
    """Why `name` is not a legal topic name, or None when it is."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > MAX_NAME_LENGTH:
        return f"topic name is longer than {MAX_NAME_LENGTH} characters"
    if not _LEGAL.fullmatch(name):
        return f"topic name {name!r} has characters other than ASCII letters, digits, '.', '_', '-'"
    return None
