"""CreateAcls (API 30), DescribeAcls (API 29), DeleteAcls (API 31): Kafka's AclBinding
management over the node's authorizer (mink/broker/security/authorizer.py).

Without an authorizer every answer is SECURITY_DISABLED ("No Authorizer is configured"), as
Kafka's. With one, CreateAcls and DeleteAcls need ALTER on the cluster, DescribeAcls
DESCRIBE on it (CLUSTER_AUTHORIZATION_FAILED otherwise). Bindings and filters are checked
as Kafka does (`acls.validate_binding`, `AclFilter.validate`; INVALID_REQUEST with Kafka's
messages). Creations are stored in one transaction; deletions resolve each filter against
the node's copy and delete exactly those bindings (one transaction), so a binding created on
another node within the last sync may be missed by a filter, as in Kafka's eventually
consistent KRaft authorizer.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.acls import AclBinding, AclFilter, InvalidAcl, validate_binding
from mink.broker.security.authorizer import ALTER, DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.controlplane import MetadataUnavailable

NO_AUTHORIZER = "No Authorizer is configured on the broker"
NOT_AUTHORIZED = "Cluster authorization failed."


def _unavailable(exc: Exception) -> tuple[ErrorCode, str]:
    return ErrorCode.request_timed_out, f"the metadata store is unavailable: {exc}"


def _refused(authorizer, ctx, operation) -> tuple[ErrorCode, str] | None:
    """Why the ACL APIs answer no at all: no authorizer, or no `operation` on the cluster."""
    if not authorizer.enabled:
        return ErrorCode.security_disabled, NO_AUTHORIZER
    if not authorizer.cluster(ctx, operation):
        return ErrorCode.cluster_authorization_failed, NOT_AUTHORIZED
    return None


async def create(node, ctx, request):
    # applied when it ends: the connection's next request sees the change (as in Kafka)
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    result = nested(schema, "AclCreationResult")
    authorizer = node.authorizer
    refused = _refused(authorizer, ctx, ALTER)
    if refused is not None:
        return build(schema, throttle_time=NO_THROTTLE, results=tuple(
            result(error_code=refused[0], error_message=refused[1])
            for _ in request.creations))
    answers: list[tuple[ErrorCode, str | None]] = []
    valid: list[AclBinding] = []
    valid_at: list[int] = []
    for c in request.creations:
        binding = AclBinding(int(c.resource_type), c.resource_name,
                             int(c.resource_pattern_type), c.principal, c.host,
                             int(c.operation), int(c.permission_type))
        try:
            validate_binding(binding)
        except InvalidAcl as exc:
            answers.append((ErrorCode.invalid_request, str(exc)))
            continue
        valid_at.append(len(answers))
        valid.append(binding)
        answers.append((ErrorCode.none, None))
    if valid:
        try:
            await authorizer.create(valid)
        except MetadataUnavailable as exc:  # one transaction: nothing stored
            for i in valid_at:
                answers[i] = _unavailable(exc)
    return build(schema, throttle_time=NO_THROTTLE, results=tuple(
        result(error_code=code, error_message=message) for code, message in answers))


def _filter(f) -> AclFilter:
    return AclFilter(int(f.resource_type_filter), f.resource_name_filter,
                     int(f.pattern_type_filter), f.principal_filter, f.host_filter,
                     int(f.operation), int(f.permission_type))


async def describe(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    authorizer = node.authorizer

    def refuse(code: ErrorCode, message: str):
        return build(schema, throttle_time=NO_THROTTLE, error_code=code,
                     error_message=message, resources=())

    refused = _refused(authorizer, ctx, DESCRIBE)
    if refused is not None:
        return refuse(*refused)
    wanted = _filter(request)
    try:
        wanted.validate()
    except InvalidAcl as exc:
        return refuse(ErrorCode.invalid_request, str(exc))
    resource = nested(schema, "DescribeAclsResource")
    description = nested(schema, "AclDescription")
    grouped: dict[tuple[int, str, int], list[AclBinding]] = {}
    for b in authorizer.index.bindings:
        if wanted.matches(b):
            grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type),
                               []).append(b)
    return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                 error_message=None, resources=tuple(
                     resource(resource_type=t, resource_name=n, pattern_type=p, acls=tuple(
                         description(principal=b.principal, host=b.host,
                                     operation=b.operation, permission_type=b.permission_type)
                         for b in bindings))
                     for (t, n, p), bindings in grouped.items()))


async def delete(node, ctx, request):
    # applied when it ends: the connection's next request sees the change (as in Kafka)
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    filter_result = nested(schema, "DeleteAclsFilterResult")
    matching = nested(schema, "DeleteAclsMatchingAcl")
    authorizer = node.authorizer
    refused = _refused(authorizer, ctx, ALTER)
    if refused is not None:
        return build(schema, throttle_time=NO_THROTTLE, filter_results=tuple(
            filter_result(error_code=refused[0], error_message=refused[1], matching_acls=())
            for _ in request.filters))
    answers: list[tuple[ErrorCode, str | None, list[AclBinding]]] = []
    doomed: set[AclBinding] = set()
    for f in request.filters:
        wanted = _filter(f)
        try:
            wanted.validate()
        except InvalidAcl as exc:
            answers.append((ErrorCode.invalid_request, str(exc), []))
            continue
        found = [b for b in authorizer.index.bindings if wanted.matches(b)]
        doomed.update(found)
        answers.append((ErrorCode.none, None, found))
    deleted: set[AclBinding] = set()
    if doomed:
        try:
            deleted = set(await authorizer.delete(sorted(doomed)))
        except MetadataUnavailable as exc:
            code, message = _unavailable(exc)
            answers = [(code, message, []) if a[0] == ErrorCode.none else a for a in answers]
    return build(schema, throttle_time=NO_THROTTLE, filter_results=tuple(
        filter_result(error_code=code, error_message=message, matching_acls=tuple(
            matching(error_code=ErrorCode.none, error_message=None,
                     resource_type=b.resource_type, resource_name=b.resource_name,
                     pattern_type=b.pattern_type, principal=b.principal, host=b.host,
                     operation=b.operation, permission_type=b.permission_type)
            for b in found if b in deleted))
        for code, message, found in answers))
