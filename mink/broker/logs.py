"""Structured logs: every line carries the node id and node epoch of the node that wrote it,
and the topic, partition, group and epoch fields where they apply; `log_format` text or
json.

The node is found through a context variable bound by the node's own task at start-up:
trio tasks inherit the context of the task that started them, so every line of a node's
tasks names that node, also with several nodes in one process (the tests, mink.testing).
Fields of a line come from `extra=` at its call site (`FIELDS` below). `NodeFilter` is
attached to the handler, not to a logger, so it sees every record the handler writes.
"""

from __future__ import annotations

import contextvars
import logging
import time

import msgspec

_current_node: contextvars.ContextVar = contextvars.ContextVar("mink_node", default=None)

# The fields a call site may pass in `extra=`, in the order text lines show them.
FIELDS = ("event", "topic", "topic_id", "partition", "leader_epoch", "group", "generation",
          "from_node", "to_node", "reason")


def bind_node(node) -> None:
    """Name `node` in every line logged by this task and the tasks it starts from now on."""
    _current_node.set(node)


class NodeFilter(logging.Filter):
    """Adds node_id and node_epoch to every record (None outside a node's tasks)."""

    def filter(self, record: logging.LogRecord) -> bool:
        node = _current_node.get()
        record.node_id = node.node_id if node is not None else None
        record.node_epoch = node.membership.node_epoch if node is not None else None
        return True


class TextFormatter(logging.Formatter):
    """`2026-12-01 11:36:40,123 INFO node=1/3 mink.x: message key=value ...`"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(node)s%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        node_id = getattr(record, "node_id", None)
        record.node = (f"node={node_id}/{getattr(record, 'node_epoch', None)} "
                       if node_id is not None else "")
        line = super().format(record)
        fields = [f"{name}={getattr(record, name)}" for name in FIELDS
                  if getattr(record, name, None) is not None]
        if fields:
            # Before a traceback, if any: the fields belong to the message line.
            head, sep, rest = line.partition("\n")
            line = f"{head} {' '.join(fields)}{sep}{rest}"
        return line


_encoder = msgspec.json.Encoder()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (RFC 3339, UTC), level, logger, message, node_id,
    node_epoch, the FIELDS present, and exc (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {"ts": f"{ts}.{int(record.msecs):03d}Z", "level": record.levelname,
                 "logger": record.name, "message": record.getMessage(),
                 "node_id": getattr(record, "node_id", None),
                 "node_epoch": getattr(record, "node_epoch", None)}
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value if isinstance(value, (int, float, bool)) else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _encoder.encode(entry).decode()


def handler_for(log_format: str, stream=None) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.addFilter(NodeFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    return handler


def setup(level: str, log_format: str, stream=None) -> None:
    """The root logger writes through one handler in `log_format` (text or json)."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler_for(log_format, stream))
    root.setLevel(level.upper())
