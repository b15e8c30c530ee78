"""AlterUserScramCredentials (API 51, KIP-554): upsert or delete users' SCRAM credentials.
The client sends the salted password (PBKDF2 done on its side); the node keeps only the
stored key and server key derived from it (`mink/protocol/scram.py`). One result per
user; a user with any invalid operation has none of them applied, as in Kafka."""

from __future__ import annotations

from collections import Counter

from kio.schema.errors import ErrorCode

from mink.protocol.scram import BY_CODE, credential_from_salted
from mink.broker.security.authorizer import ALTER
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.controlplane.security import (
    credentials_of,
    delete_credential,
    upsert_credential,
)


def _check(op, upsert: bool) -> tuple[ErrorCode, str] | None:
    if not op.name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    mechanism = BY_CODE.get(op.mechanism)
    if mechanism is None:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    if upsert:
        if op.iterations < mechanism.min_iterations:
            return ErrorCode.unacceptable_credential, "Too few iterations"
        if op.iterations > mechanism.max_iterations:
            return ErrorCode.unacceptable_credential, "Too many iterations"
        if not op.salt or not op.salted_password:
            return ErrorCode.unacceptable_credential, "Salt and salted password must be given"
    return None


async def handle(node, ctx, request):
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    result = nested(schema, "AlterUserScramCredentialsResult")
    ops = [(op, False) for op in request.deletions] + [(op, True) for op in request.upsertions]
    twice = Counter((op.name, op.mechanism) for op, _ in ops)
    errors: dict[str, tuple[ErrorCode, str]] = {}
    if not node.authorizer.cluster(ctx, ALTER):
        errors = {op.name: (ErrorCode.cluster_authorization_failed,
                            "Cluster authorization failed.") for op, _ in ops}
    for op, upsert in ops:
        if op.name in errors:
            continue
        if twice[(op.name, op.mechanism)] > 1:
            errors[op.name] = (ErrorCode.duplicate_resource,
                               "A user credential cannot be altered twice in the same request")
            continue
        problem = _check(op, upsert)
        if problem is not None:
            errors[op.name] = problem
    users = list(dict.fromkeys(op.name for op, _ in ops))
    for user in users:
        if user in errors:
            continue
        existing = {row[1] for row in await credentials_of(node.metadata, user)}
        for op, upsert in ops:
            if op.name == user and not upsert and BY_CODE[op.mechanism].name not in existing:
                errors[user] = (ErrorCode.resource_not_found,
                                "Attempt to delete a user credential that does not exist")
    for op, upsert in ops:
        if op.name in errors:
            continue
        mechanism = BY_CODE[op.mechanism]
        if upsert:
            credential = credential_from_salted(mechanism, bytes(op.salted_password),
                                                bytes(op.salt), op.iterations)
            await upsert_credential(node.metadata, (
                op.name, mechanism.name, credential.salt, credential.stored_key,
                credential.server_key, credential.iterations))
        else:
            await delete_credential(node.metadata, op.name, mechanism.name)
    return build(schema, throttle_time=NO_THROTTLE, results=tuple(
        result(user=user, error_code=errors.get(user, (ErrorCode.none, None))[0],
               error_message=errors.get(user, (ErrorCode.none, None))[1])
        for user in users))
