"""The processes of a campaign: PostgreSQL, moto's S3 server, an S3 fault proxy, Mink nodes.

Everything is started as a child of the campaign process with PR_SET_PDEATHSIG, so even a
SIGKILLed campaign leaves nothing running; `Services.close()` stops the rest in order. Children
are started from the main thread only: the death signal follows the thread that forked.
"""

from __future__ import annotations

import ctypes
import http.client
import http.server
import logging
import os
import pwd
import random
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("chaos")

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout: float, process: subprocess.Popen | None = None,
                   what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout} s")


def mink_command() -> list[str]:
    """The `mink` console script next to this interpreter (what a user runs)."""
    script = Path(sys.executable).parent / "mink"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "mink.cli"]


class FakeClock:
    """A libfaketime offset file: processes started with `env()` read it every second."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0.0
        self.set(0.0)

    def set(self, seconds: float) -> None:
        self.offset = seconds
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+.3f}\n")
        tmp.chmod(0o644)
        os.replace(tmp, self.path)

    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME_TIMESTAMP_FILE": str(self.path),
                "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def faketime_available() -> bool:
    return Path(FAKETIME_LIB).exists()


def remove_faketime_leftovers(since: float, shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """libfaketime makes `faketime_shm_<pid>` and `sem.faketime_sem_<pid>` in /dev/shm for
    each process it is loaded into, and removes them only when that process exits normally:
    a process the campaign killed (or one of its children) leaves them. Removes those made
    since `since` (a time.time()) whose process is gone; returns their names."""
    removed = []
    for path in list(shm_dir.glob("faketime_shm_*")) + list(shm_dir.glob("sem.faketime_sem_*")):
        try:
            pid = int(path.name.rsplit("_", 1)[1])
            if path.stat().st_mtime < since or _alive(pid):
                continue
            path.unlink()
            removed.append(path.name)
        except (ValueError, OSError):
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- PostgreSQL ---------------------------------------------------------------------------------


def postgres_bin_dir() -> Path:
    """Debian's PostgreSQL if installed, else the binaries of the `pgserver` wheel."""
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if debian:
        return debian[-1].parent
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


class Postgres:
    """A postmaster run directly as our child: restartable (immediate stop) and pausable."""

    def __init__(self, root: Path, clock: FakeClock | None = None) -> None:
        self.root = root
        self.data_dir = root / "pgdata"
        self.port = free_port()
        self.bin = postgres_bin_dir()
        self.clock = clock
        self.process: subprocess.Popen | None = None
        self.paused: list[int] = []
        self.user: str | None = None
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            self.user = "pgserver"
            try:
                pwd.getpwnam(self.user)
            except KeyError:
                subprocess.run(["useradd", "-M", "-s", "/bin/false", self.user], check=True,
                               capture_output=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir()
        if self.user:
            for parent in [self.root, *self.root.parents]:
                mode = parent.stat().st_mode
                if mode & 0o055 != 0o055:
                    parent.chmod(mode | 0o055)
            shutil.chown(self.data_dir, self.user, self.user)
        self.data_dir.chmod(0o700)
        subprocess.run([str(self.bin / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                        "--auth=trust", "--encoding=UTF8", "--no-sync"], user=self.user,
                       check=True, capture_output=True, cwd="/", timeout=120)

    def start(self) -> None:
        env = dict(os.environ)
        if self.clock is not None:
            env.update(self.clock.env())
        log_file = open(self.root / "postgres.log", "ab")
        self.process = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data_dir), "-h", "127.0.0.1",
             "-p", str(self.port), "-k", "", "-c", "max_connections=300", "-c", "fsync=off",
             # fsync off: an immediate stop keeps every commit (the OS has the data); a
             # synchronous_commit=off would not, and would fake lost writes.
             "-c", "full_page_writes=off"],
            user=self.user, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd="/",
            preexec_fn=_die_with_parent, start_new_session=True)  # Ctrl-C is ours to handle
        log_file.close()
        self.wait_ready()

    def wait_ready(self, timeout: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.process.returncode}")
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _pids(self) -> list[int]:
        """The postmaster and its children."""
        if not self.running():
            return []
        root = self.process.pid
        pids = [root]
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == root:
                    pids.append(int(entry))
        return pids

    def pause(self) -> None:
        self.paused = self._pids()
        for pid in self.paused:
            _signal(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self.paused:
            _signal(pid, signal.SIGCONT)
        self.paused = []

    def stop_immediate(self) -> None:
        self.resume()
        if not self.running():
            return
        self.process.send_signal(signal.SIGQUIT)  # immediate shutdown
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            for pid in self._pids():
                _signal(pid, signal.SIGKILL)
            self.process.wait(10)

    def close(self) -> None:
        self.stop_immediate()


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


# -- S3: moto and a fault proxy in front of it ----------------------------------------------------


class Moto:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.paused = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log_file = open(self.root / "moto.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
            start_new_session=True)
        log_file.close()
        wait_listening(self.port, 60, self.process, "moto")

    def create_bucket(self, name: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=name)
        client.close()

    def pause(self) -> None:
        if self.process is not None:
            _signal(self.process.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.process is not None and self.paused:
            _signal(self.process.pid, signal.SIGCONT)
            self.paused = False

    def close(self) -> None:
        self.resume()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te",
               "trailer", "upgrade"}


class _Upstream(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class S3FaultProxy:
    """An HTTP proxy in front of moto that can answer errors, lose replies, slow or refuse
    requests. Controls are plain attributes, read once per request:

    - error_rate: fraction answered 503 SlowDown without reaching moto
    - lost_reply_rate: fraction carried out by moto and then answered 500 (the client cannot
      know the outcome; a PUT it retries meets its own object)
    - delay: seconds added before each request is forwarded
    - refuse: every request's connection is closed without an answer
    """

    def __init__(self, upstream_port: int, seed: int) -> None:
        self.upstream_port = upstream_port
        self.error_rate = 0.0
        self.lost_reply_rate = 0.0
        self.delay = 0.0
        self.refuse = False
        self.counts = {"forwarded": 0, "errors": 0, "lost_replies": 0, "refused": 0}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # headers and body go out in separate writes: without this, Nagle and the
                # peer's delayed ACK add 40 ms to every request
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                verdict = proxy._verdict()
                if verdict == "refuse":
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if verdict == "error":
                    self._reply(503, {"Content-Type": "application/xml"},
                                b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown"
                                b"</Code><Message>injected by chaos</Message></Error>")
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                headers["Content-Length"] = str(len(body))
                connection = _Upstream("127.0.0.1", proxy.upstream_port, timeout=60)
                try:
                    connection.request(self.command, self.path, body=body, headers=headers)
                    response = connection.getresponse()
                    data = response.read()
                    status = response.status
                    out = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
                finally:
                    connection.close()
                if verdict == "lose":
                    self._reply(500, {"Content-Type": "application/xml"},
                                b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>"
                                b"InternalError</Code><Message>reply lost by chaos</Message>"
                                b"</Error>")
                    return
                if self.command != "HEAD":
                    out = {k: v for k, v in out.items() if k.lower() != "content-length"}
                    out["Content-Length"] = str(len(data))
                self._reply(status, out, b"" if self.command == "HEAD" else data)

            def _reply(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response_only(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if data:
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that went away mid-request (faults do that); nothing to say

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="s3-fault-proxy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def heal(self) -> None:
        self.error_rate = self.lost_reply_rate = self.delay = 0.0
        self.refuse = False

    def _verdict(self) -> str:
        delay = self.delay
        if delay:
            time.sleep(delay)
        with self._lock:
            if self.refuse:
                self.counts["refused"] += 1
                return "refuse"
            roll = self._rng.random()
            if roll < self.error_rate:
                self.counts["errors"] += 1
                return "error"
            if self._rng.random() < self.lost_reply_rate:
                self.counts["lost_replies"] += 1
                return "lose"
            self.counts["forwarded"] += 1
            return "forward"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# -- Mink nodes -----------------------------------------------------------------------------------


class Node:
    """One `mink serve` process, configured through MINK_* variables as a user would."""

    def __init__(self, node_id: int, root: Path, settings: dict[str, Any],
                 clock: FakeClock | None = None) -> None:
        self.node_id = node_id
        self.port = free_port()
        self.root = root
        self.settings = settings
        self.clock = clock
        self.process: subprocess.Popen | None = None
        self.paused = False
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: float = 60.0) -> None:
        env = dict(os.environ)
        for key, value in self.settings.items():
            env[f"MINK_{key.upper()}"] = str(value)
        env["MINK_NODE_ID"] = str(self.node_id)
        env["MINK_LISTENER"] = self.address
        if self.clock is not None:
            env.update(self.clock.env())
        log_file = open(self.root / f"node-{self.node_id}.log", "ab")
        log_file.write(f"--- start {self.starts} at {time.strftime('%H:%M:%S')}\n".encode())
        log_file.flush()
        self.process = subprocess.Popen(mink_command() + ["serve"], env=env, stdout=log_file,
                                        stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                        start_new_session=True)
        log_file.close()
        self.starts += 1
        self.paused = False
        wait_listening(self.port, wait, self.process, f"node {self.node_id}")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        self.resume()
        if self.running():
            self.process.kill()
            self.process.wait(10)

    def pause(self) -> None:
        if self.running():
            _signal(self.process.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused and self.process is not None:
            _signal(self.process.pid, signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 20.0) -> None:
        self.resume()
        if self.running():
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
