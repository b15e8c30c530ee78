"""The admin HTTP listener: hypercorn's trio worker serving a small ASGI app.

Routes, GET or HEAD: /healthz, /readyz (health.py), /metrics (metrics.py), /console and
/console/state (console.py), and key lookups on compacted topics,
/kv/<topic>/<partition>/<key> (the key percent-encoded; `mink get`): 200 with the value, 404
not found, 503 while the partition's KV tablet is still restoring; a node that does not lead
the partition forwards the lookup to its leader's admin listener (421 with the leader's id
when it cannot find it). Lookups need credentials and READ on the topic once the
authorizer is on or any Kafka listener uses SASL (auth.py: 401, 403); the other routes stay
open. A hand router is enough for that. The server runs in the node's nursery and stops
with it.

`admin_listener = "https://HOST:PORT"` serves TLS (hypercorn's trio worker wraps its socket
in trio's SSLListener) with the Kafka listeners' certificate, `ssl_cert_file` and
`ssl_key_file`; a lookup is then forwarded over TLS too, the leader's certificate checked
against `ssl_ca_file` (else the system's CAs) and its host name. The scheme is the
cluster's: a node forwards with its own (the published admin addresses carry none), as Kafka
wants one inter-broker security protocol for all brokers. A secured node (auth.py) whose
admin listener is plain HTTP never forwards a lookup: that would send the inter-broker
user's password in cleartext; it answers 421 with the leader, and says why at start.
"""

from __future__ import annotations

import base64
import logging
import ssl
from functools import partial
from urllib.parse import unquote_to_bytes

import msgspec
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from mink.broker.admin.auth import PRINCIPAL_HEADER, AdminAuth, Refused, header
from mink.broker.admin.console import PAGE, Console
from mink.broker.admin.health import readiness
from mink.broker.config import split_host_port
from mink.broker.security.authorizer import READ
from mink.broker.security.tls import HANDSHAKE_TIMEOUT

log = logging.getLogger(__name__)

HTML = b"text/html; charset=utf-8"
JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
# What Prometheus asks for and prometheus-client writes (text format 0.0.4).
PROMETHEUS_TEXT = b"text/plain; version=0.0.4; charset=utf-8"

_json = msgspec.json.Encoder()


class AdminApp:
    """The ASGI application of one node."""

    def __init__(self, node, console: Console) -> None:
        self.node = node
        self.console = console
        self.auth = AdminAuth(node)
        # over https:// lookups are forwarded over TLS, the peer checked against the CA
        self.peer_tls: ssl.SSLContext | None = None
        if node.config.admin_scheme() == "https":
            self.peer_tls = ssl.create_default_context(cafile=node.config.ssl_ca_file)
        self.routes = {"/healthz": self.healthz, "/readyz": self.readyz,
                       "/metrics": self.metrics, "/console": self.console_page,
                       "/console/state": self.console_state}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: not served
        route = self.routes.get(scope["path"])
        method = scope["method"]
        if route is None and scope["path"].startswith("/kv/") and method in ("GET", "HEAD"):
            try:
                status, content_type, body = await self.key_lookup(scope)
            except Exception:  # noqa: BLE001 - as any page: never the listener down
                log.exception("admin listener: %s failed", scope["path"])
                status, content_type, body = 500, TEXT, b"internal error\n"
            route = _done
        elif route is None:
            status, content_type, body = 404, TEXT, b"not found\n"
        elif method not in ("GET", "HEAD"):
            status, content_type, body = 405, TEXT, b"method not allowed\n"
        elif route is not _done:
            try:
                status, content_type, body = route()
            except Exception:  # one bad page must never take the listener (or node) down
                log.exception("admin listener: %s failed", scope["path"])
                status, content_type, body = 500, TEXT, b"internal error\n"
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body)),
                   (b"cache-control", b"no-store")]
        if status == 405:
            headers.append((b"allow", b"GET, HEAD"))
        if status == 401:
            headers.append((b"www-authenticate", b'Basic realm="mink", charset="UTF-8"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})

    async def key_lookup(self, scope) -> tuple[int, bytes, bytes]:
        """GET /kv/<topic>/<partition>/<key>: the latest value of the key (tablets.py)."""
        raw = scope.get("raw_path") or scope["path"].encode()
        parts = raw.split(b"/", 4)  # b"", b"kv", topic, partition, key
        if len(parts) != 5 or not parts[4]:
            return 400, TEXT, b"use /kv/<topic>/<partition>/<key>\n"
        topic = unquote_to_bytes(parts[2]).decode("utf-8", "replace")
        try:
            partition = int(parts[3])
        except ValueError:
            return 400, TEXT, b"the partition is a number\n"
        key = unquote_to_bytes(parts[4])
        try:
            requester = await self.auth.requester(scope)
        except Refused as refused:
            return refused.status, TEXT, refused.message.encode() + b"\n"
        if requester is not None and not self.node.authorizer.topic(requester, READ, topic):
            return 403, TEXT, b"not authorized to read the topic\n"
        found = await self.node.tablets.lookup(topic, partition, key)
        body = {"topic": topic, "partition": partition, "status": found.status}
        if found.status == "found":
            body.update(offset=found.offset, value_base64=base64.b64encode(
                found.value or b"").decode(), value=_text_or_none(found.value))
            return 200, JSON, _json.encode(body)
        if found.status == "not_leader" and found.leader is not None \
                and not _forwarded(scope):
            # Any node answers: the lookup goes to the leader's admin listener, once.
            address = await self.node.tablets.admin_address_of(found.leader)
            carried = self.auth.forwarding_headers(requester)
            if carried and self.peer_tls is None:
                # credentials in cleartext: not sent (serve_admin said so at start)
                carried = None
                body["error"] = ("not forwarded: the admin listener is plain HTTP and the "
                                 "lookup would carry a password; ask the leader")
            if address is not None and carried is not None:
                try:
                    with trio.fail_after(FORWARD_TIMEOUT_S):
                        return await _forward(address, raw, carried, self.peer_tls)
                except (OSError, trio.TooSlowError, trio.BrokenResourceError,
                        ValueError) as exc:
                    # a failed TLS handshake says why in its cause
                    reason = (exc.__cause__ or exc) if isinstance(
                        exc, trio.BrokenResourceError) else exc
                    log.info("lookup forwarded to node %d failed: %r", found.leader, reason)
                    body["error"] = f"forwarding to node {found.leader} failed"
                    return 502, JSON, _json.encode({**body, "leader": found.leader})
        status = {"not_found": 404, "unknown_topic": 404, "loading": 503,
                  "not_leader": 421}[found.status]
        if found.status == "not_leader":
            body["leader"] = found.leader
        return status, JSON, _json.encode(body)

    def healthz(self) -> tuple[int, bytes, bytes]:
        return 200, JSON, _json.encode({"status": "ok", "node_id": self.node.node_id})

    def readyz(self) -> tuple[int, bytes, bytes]:
        node = self.node
        state = readiness(node)
        body = _json.encode({"ready": state.ready, "node_id": node.node_id,
                             "node_epoch": node.membership.node_epoch, "registered": state.registered,
                             "view_loaded": state.view_loaded, "not_fenced": state.not_fenced})
        return (200 if state.ready else 503), JSON, body

    def metrics(self) -> tuple[int, bytes, bytes]:
        return 200, PROMETHEUS_TEXT, self.node.metrics.exposition()

    def console_page(self) -> tuple[int, bytes, bytes]:
        return 200, HTML, PAGE

    def console_state(self) -> tuple[int, bytes, bytes]:
        return 200, JSON, self.console.current()


FORWARD_TIMEOUT_S = 35.0  # above a lookup's own wait for its tablet
FORWARDED = b"x-mink-forwarded"


def _forwarded(scope) -> bool:
    """A lookup forwarded once is not forwarded again (a client sending the header only
    keeps its lookup from being forwarded)."""
    return header(scope, FORWARDED) is not None or header(scope, PRINCIPAL_HEADER) is not None


async def _forward(address: tuple[str, int], raw_path: bytes,
                   carried: list[tuple[bytes, bytes]],
                   tls: ssl.SSLContext | None = None) -> tuple[int, bytes, bytes]:
    """GET raw_path from another node's admin listener (HTTP/1.1, one request, the
    connection closed after it) with the `carried` headers (auth.py), over TLS with `tls`
    (the peer's certificate and host name checked): (status, content type, body)."""
    host, port = address
    stream = await trio.open_tcp_stream(host, port)
    if tls is not None:
        # https_compatible: the answer ends where the server closes, close_notify or not
        stream = trio.SSLStream(stream, tls, server_hostname=host, https_compatible=True)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                await stream.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
    extra = b"".join(b"%s: %s\r\n" % (name, value) for name, value in carried)
    async with stream:
        await stream.send_all(b"GET %s HTTP/1.1\r\nHost: %s:%d\r\n%s: 1\r\n%s"
                              b"Connection: close\r\n\r\n"
                              % (raw_path, host.encode(), port, FORWARDED, extra))
        response = bytearray()
        while chunk := await stream.receive_some(65536):
            response += chunk
            if len(response) > 64 << 20:
                raise ValueError("forwarded lookup answer too large")
    head, _, body = bytes(response).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    try:  # a peer speaking TLS to plain HTTP closes without an answer
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise ValueError(f"no HTTP answer: {bytes(response[:32])!r}") from None
    content_type = JSON
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-type":
            content_type = value.strip()
    return status, content_type, body


def _done():  # the route that was served already
    raise AssertionError("not called")


def _text_or_none(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def serve_admin(node, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the node's admin listener until cancelled, if `admin_listener` is set; reports
    the bound (host, port), or None when it is off (and returns at once)."""
    address = node.config.admin_address()
    if address is None:
        task_status.started(None)
        return
    host, port = address
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    tls = node.config.admin_scheme() == "https"
    if tls:  # hypercorn serves TLS when given a certificate and key
        config.certfile = node.config.ssl_cert_file
        config.keyfile = node.config.ssl_key_file
        config.keyfile_password = node.config.ssl_key_password
        config.ssl_handshake_timeout = HANDSHAKE_TIMEOUT
    config.accesslog = None
    config.errorlog = logging.getLogger("mink.broker.admin.hypercorn")
    config.graceful_timeout = 1.0
    config.include_server_header = False
    console = Console(node)
    app = AdminApp(node, console)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, config, mode="asgi"))
        bound = split_host_port(binds[0].split("://", 1)[1])
        node.admin_address = bound
        nursery.start_soon(node.metrics.lag.run)
        nursery.start_soon(console.run)
        log.info("admin listener on %s://%s:%d (/metrics, /healthz, /readyz, /console)",
                 "https" if tls else "http", *bound)
        if app.auth.required and not tls:
            log.warning("admin listener: plain HTTP on a node whose key lookups need "
                        "credentials: their passwords cross the network in cleartext, and "
                        "lookups are not forwarded to the leader (that would send the "
                        "inter-broker password); set admin_listener = \"https://HOST:PORT\"")
        task_status.started(bound)
