"""Client strings in PostgreSQL `text`, exactly: a checked encoding around the one character
PostgreSQL text (and jsonb) cannot hold, NUL (U+0000).

Kafka strings may hold any character; confluent-kafka sends commit metadata with a trailing
NUL. `to_pg` maps U+0001 to U+0001 U+0001 and U+0000 to U+0001 '0'; every other character,
and so every string without U+0000 or U+0001, is stored as it is (names stay readable and
comparable in SQL). `from_pg` inverts it and refuses anything `to_pg` cannot have written.
The mapping is injective, so equality in SQL (keys, `= ANY`) is equality of the originals.
"""

from __future__ import annotations

from typing import Any

_ESCAPE = "\x01"
_NUL = "\x00"


class CorruptText(ValueError):
    """A stored string that `to_pg` cannot have written."""


def to_pg(value: str | None) -> str | None:
    if value is None or (_NUL not in value and _ESCAPE not in value):
        return value
    return value.replace(_ESCAPE, _ESCAPE + _ESCAPE).replace(_NUL, _ESCAPE + "0")


def from_pg(value: str | None) -> str | None:
    if value is None or _ESCAPE not in value:
        return value
    out = []
    i, end = 0, len(value)
    while i < end:
        j = value.find(_ESCAPE, i)
        if j < 0:
            out.append(value[i:])
            break
        out.append(value[i:j])
        follower = value[j + 1 : j + 2]
        if follower == _ESCAPE:
            out.append(_ESCAPE)
        elif follower == "0":
            out.append(_NUL)
        else:
            raise CorruptText(f"invalid escape {follower!r} at {j} in a stored string")
        i = j + 2
    return "".join(out)


def dict_to_pg(values: dict[str, Any]) -> dict[str, Any]:
    """Keys and string values of a dict (topic configs) for a jsonb column."""
    return {to_pg(k): to_pg(v) if isinstance(v, str) else v for k, v in values.items()}


def dict_from_pg(values: dict[str, Any]) -> dict[str, Any]:
    if not any(_ESCAPE in k or (isinstance(v, str) and _ESCAPE in v)
               for k, v in values.items()):
        return values
    return {from_pg(k): from_pg(v) if isinstance(v, str) else v for k, v in values.items()}
