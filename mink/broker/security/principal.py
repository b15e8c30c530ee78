"""The principal of a connection (Kafka's KafkaPrincipal).

There is no authentication yet: every connection is `User:ANONYMOUS`, as on a Kafka
PLAINTEXT listener. The principal is a field of the connection (`Connection.principal`,
read by handlers as `ctx.principal`), so authentication only has to set it there; quotas
match their user entities against its name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"


USER_TYPE = "User"
ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")

__all__ = ["ANONYMOUS", "USER_TYPE", "KafkaPrincipal"]
