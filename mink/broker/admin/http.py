"""The admin HTTP listener: hypercorn's trio worker serving a small ASGI app.

Routes, GET or HEAD: /healthz, /readyz (health.py), /metrics (metrics.py), /console and
/console/state (console.py). A hand router is enough for that. The server runs in the node's
nursery and stops with it.
"""

from __future__ import annotations

import logging
from functools import partial

import msgspec
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from mink.broker.admin.console import PAGE, Console
from mink.broker.admin.health import readiness
from mink.broker.config import split_host_port

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
        if route is None:
            status, content_type, body = 404, TEXT, b"not found\n"
        elif method not in ("GET", "HEAD"):
            status, content_type, body = 405, TEXT, b"method not allowed\n"
        else:
            try:
                status, content_type, body = route()
            except Exception:  # one bad page must never take the listener (or node) down
                log.exception("admin listener: %s failed", scope["path"])
                status, content_type, body = 500, TEXT, b"internal error\n"
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body)),
                   (b"cache-control", b"no-store")]
        if status == 405:
            headers.append((b"allow", b"GET, HEAD"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})

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
    config.accesslog = None
    config.errorlog = logging.getLogger("mink.broker.admin.hypercorn")
    config.graceful_timeout = 1.0
    config.include_server_header = False
    console = Console(node)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, AdminApp(node, console), config,
                                            mode="asgi"))
        bound = split_host_port(binds[0].split("://", 1)[1])
        node.admin_address = bound
        nursery.start_soon(node.metrics.lag.run)
        nursery.start_soon(console.run)
        log.info("admin listener on http://%s:%d (/metrics, /healthz, /readyz, /console)",
                 *bound)
        task_status.started(bound)
