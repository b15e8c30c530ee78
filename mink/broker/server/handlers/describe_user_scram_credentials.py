"""DescribeUserScramCredentials (API 50, KIP-554): the mechanisms and iterations of users'
SCRAM credentials, never their keys."""

from __future__ import annotations

from collections import Counter

from kio.schema.errors import ErrorCode

from mink.protocol.scram import MECHANISMS
from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.controlplane.security import described_credentials


async def handle(node, ctx, request):
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    result = nested(schema, "DescribeUserScramCredentialsResult")
    info = nested(schema, "CredentialInfo")
    if not node.authorizer.cluster(ctx, DESCRIBE):
        return build(schema, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed,
                     error_message="Cluster authorization failed.", results=())
    stored: dict[str, list] = {}
    for user, mechanism, iterations in await described_credentials(node.metadata):
        stored.setdefault(user, []).append(
            info(mechanism=MECHANISMS[mechanism].code, iterations=iterations))
    results = []
    if not request.users:
        for user, infos in sorted(stored.items()):
            results.append(result(user=user, error_code=ErrorCode.none, error_message=None,
                                  credential_infos=tuple(infos)))
    else:
        counts = Counter(u.name for u in request.users)
        for name in dict.fromkeys(u.name for u in request.users):
            if counts[name] > 1:
                results.append(result(
                    user=name, error_code=ErrorCode.duplicate_resource,
                    error_message="Cannot describe SCRAM credentials for the same user twice "
                                  "in a single request", credential_infos=()))
            elif name not in stored:
                results.append(result(
                    user=name, error_code=ErrorCode.resource_not_found,
                    error_message="Attempt to describe a user credential that does not exist",
                    credential_infos=()))
            else:
                results.append(result(user=name, error_code=ErrorCode.none, error_message=None,
                                      credential_infos=tuple(stored[name])))
    return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                 error_message=None, results=tuple(results))
