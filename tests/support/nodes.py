"""Mink nodes for the tests: in-process (in the test's trio run) or as subprocesses."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mink.broker.config import Config
from mink.broker.node import run_node


def require_tool(name: str) -> str:
    """The path of an external tool; a missing tool skips the test, except in CI."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("MINK_REQUIRE_TOOLS"):
            pytest.fail(f"{name} is required in CI but is not installed")
        pytest.skip(f"{name} is not installed (apt-get install {name})")
    return path


def node_config(pg_url: str, store_url: str, **overrides) -> Config:
    values = dict(node_id=1, listener="127.0.0.1:0", postgres_url=pg_url,
                  object_store=store_url, lease_ttl=6.0, coordinator_tick=1.0)
    values.update(overrides)
    return Config(**values)


async def start_node(nursery, config: Config) -> str:
    """Start a node in `nursery`; returns its bootstrap address."""
    host, port = await nursery.start(run_node, config)
    return f"{host}:{port}"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    root = tmp_path / "objects"
    root.mkdir()
    return root.as_uri()


@pytest.fixture
def node_settings() -> dict:
    """Config settings of the `node` fixture beyond the harness's defaults; a test module
    overrides this fixture to change them."""
    return {}


@pytest.fixture
async def node(mink_postgres, store_url: str, node_settings: dict):
    """A single in-process node (the harness's `mink.testing.open_node`, in the test's trio
    run) on a fresh database of the session's PostgreSQL and the file:// store; yields
    host:port. A test module may override `node_settings` to change its Config."""
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         **node_settings) as running:
        yield running.bootstrap


class PortTaken(RuntimeError):
    """The node could not bind its listener: another process took the port first."""


class NodeProcess:
    """`mink serve` in a subprocess, for tests that kill a node."""

    def __init__(self, config: Config, log_path: Path):
        self.config = config
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return self.config.advertised_listener or self.config.listener

    def start(self, timeout: float = 90.0) -> None:
        # A subprocess node imports and starts in about 2 s on a quiet machine, but took
        # 15-30 s (and failed at 30 s) with a load average of 12 on two cores.
        env = dict(os.environ)
        for name in Config.__struct_fields__:
            value = getattr(self.config, name)
            if value is not None:
                env[f"MINK_{name.upper()}"] = str(value)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "mink.cli", "serve"],
                                        env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        host, port = self.address.rsplit(":", 1)
        listener = self.config.listener
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                text = self.log_path.read_text(errors="replace")
                error = PortTaken if "Address already in use" in text else RuntimeError
                raise error(f"node exited with {self.process.returncode}:\n{text[-3000:]}")
            try:
                with socket.create_connection((host, int(port)), timeout=0.2):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            # Something listens there; it is this node only once its log says so (a port
            # picked free can be taken by another test's process before the node binds it).
            if f"listening for Kafka clients on {listener}" in self.log_path.read_text(
                    errors="replace"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"node did not listen within {timeout}s:\n"
                           f"{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the node holds still (its sockets open, its transactions where they are)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> int | None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode if self.process else None


@pytest.fixture
def node_processes(tmp_path: Path):
    """Factory of subprocess nodes; every one still running is killed at the end."""
    started: list[NodeProcess] = []

    def make(config: Config) -> NodeProcess:
        node_process = NodeProcess(config, tmp_path / f"node-{config.node_id}-{len(started)}.log")
        started.append(node_process)
        return node_process

    yield make
    for node_process in started:
        node_process.kill()


KAFKAJS_VERSION = "2.2.4"


@pytest.fixture(scope="session")
def kafkajs_modules() -> Path:
    """A folder whose node_modules holds kafkajs (installed once with npm into
    tests/.node_modules/, ignored by git, reused by later runs); skips without node or npm,
    or when npm cannot install, unless MINK_REQUIRE_TOOLS is set."""
    require_tool("node")
    npm = require_tool("npm")
    prefix = Path(__file__).resolve().parent.parent / ".node_modules"
    marker = prefix / "node_modules" / "kafkajs" / "package.json"
    if not marker.exists() or f'"version": "{KAFKAJS_VERSION}"' not in marker.read_text():
        prefix.mkdir(exist_ok=True)
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix",
                               str(prefix), f"kafkajs@{KAFKAJS_VERSION}"],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not marker.exists():
            message = f"npm install kafkajs@{KAFKAJS_VERSION} failed: {done.stderr[-2000:]}"
            if os.environ.get("MINK_REQUIRE_TOOLS"):
                pytest.fail(message)
            pytest.skip(message)
    return prefix
