"""A PostgreSQL server run from the binaries in the `pgserver` wheel.

Used by `mink dev` (data kept under the data dir) and by the tests (a throwaway server on a
free loopback port). PostgreSQL refuses to run as root, so as root the server runs as a
system user `pgserver`, created on first use, as the wheel itself does.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

import warnings
from functools import cache

RUN_AS_USER = "pgserver"


@cache
def postgres_bin_path() -> Path:
    """Where the `pgserver` wheel keeps PostgreSQL's binaries. The wheel is an extra
    (`mink[dev]`, `mink[test]`, `mink[testing]`): `mink serve` runs without it."""
    with warnings.catch_warnings():
        # pgserver looks up a runtime directory at import time and warns when
        # XDG_RUNTIME_DIR is unset; we use only its binaries.
        warnings.simplefilter("ignore")
        from pgserver._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(RUN_AS_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/false", RUN_AS_USER], check=True,
                       capture_output=True)
    return RUN_AS_USER


def _make_traversable(path: Path) -> None:
    # The server's user must reach its data directory through every parent.
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o055 != 0o055:
            parent.chmod(mode | 0o055)


class EmbeddedPostgres:
    """initdb (once), start, stop, kill. Listens on TCP loopback only."""

    def __init__(self, data_dir: Path, port: int | None = None, host: str = "127.0.0.1",
                 *, durable: bool = True):
        # durable=False turns fsync off: for throwaway test servers only. A server killed
        # with SIGKILL keeps every commit either way (the OS still has the data); a machine
        # crash would not.
        self.durable = durable
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.user = _run_as()
        self.log_file = self.data_dir.parent / (self.data_dir.name + ".log")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

    def _bin(self, name: str) -> str:
        return str(postgres_bin_path() / name)

    def _run(self, args: list[str], timeout: float = 60) -> None:
        proc = subprocess.run(args, user=self.user, capture_output=True, text=True,
                              timeout=timeout, cwd="/")
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed ({proc.returncode}): "
                               f"{proc.stderr.strip() or proc.stdout.strip()}")

    def init(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.user:
            _make_traversable(self.data_dir.parent)
            _make_traversable(postgres_bin_path().parent)
            shutil.chown(self.data_dir, self.user, self.user)
        self.data_dir.chmod(0o700)
        self._run([self._bin("initdb"), "-D", str(self.data_dir), "-U", "postgres",
                   "--auth=trust", "--encoding=UTF8", "--no-sync"])

    def start(self) -> None:
        self.init()
        if self.user:
            self.log_file.touch()
            shutil.chown(self.log_file, self.user, self.user)
        options = f"-h {self.host} -p {self.port} -k '' -c max_connections=200"
        if not self.durable:
            options += " -c fsync=off -c full_page_writes=off"
        self._run([self._bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
                   "-w", "-t", "60", "-o", options, "start"], timeout=90)

    def stop(self, mode: str = "fast") -> None:
        self._run([self._bin("pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w",
                   "stop"], timeout=90)

    def running(self) -> bool:
        proc = subprocess.run([self._bin("pg_ctl"), "-D", str(self.data_dir), "status"],
                              user=self.user, capture_output=True, cwd="/")
        return proc.returncode == 0

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running():
            self.stop("immediate")
