"""`mink dev`: one folder, one node."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from confluent_kafka.admin import AdminClient, NewTopic

from mink.storage.embedded_postgres import EmbeddedPostgres, free_port


def _dev(data_dir, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "mink.cli", "dev", "--data-dir", str(data_dir),
         "--listener", f"127.0.0.1:{port}", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float) -> None:
    """Until `text` is in a line of proc's output (its first line: what follows it in the
    same write is in the pipe's buffer, where select does not see it)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            seen.append(line)
            if text in line:
                return
        if proc.poll() is not None:
            break
    raise AssertionError(f"no {text!r} from mink dev within {timeout} s: {seen}, "
                         f"stderr {proc.stderr.read() if proc.poll() is not None else ''}")


def _create_topic(port: int, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    admin.create_topics([NewTopic(name, 1, 1)], request_timeout=15)[name].result(timeout=30)


def test_a_second_dev_of_the_same_folder_leaves_the_first_alone(tmp_path):
    """The second refuses at once (the folder is locked); the first keeps its PostgreSQL,
    serves, and stops cleanly. Before the lock the second stopped the first one's
    PostgreSQL, taking it for a killed node's."""
    try:
        _second_dev_then_a_killed_one(tmp_path)
    finally:  # a node killed here leaves its PostgreSQL running
        postgres = EmbeddedPostgres(tmp_path / "postgres")
        if postgres.running():
            postgres.stop("immediate")


def _second_dev_then_a_killed_one(tmp_path) -> None:
    first_port, second_port = free_port(), free_port()
    first = _dev(tmp_path, first_port)
    try:
        _wait_for_line(first, "one node, data in", 120)
        _create_topic(first_port, "before")

        second = _dev(tmp_path, second_port)
        try:
            _, err = second.communicate(timeout=60)
        finally:
            second.kill()
        assert second.returncode == 2
        assert "is in use by another mink dev" in err and f"pid {first.pid}" in err

        _create_topic(first_port, "after")  # needs the first node's PostgreSQL
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        assert "Traceback" not in err and "had stopped already" not in err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()

    # a killed node's lock goes with it (its PostgreSQL stays behind): the next start takes
    # the folder over, stopping that PostgreSQL first
    killed = _dev(tmp_path, first_port)
    try:
        _wait_for_line(killed, "one node, data in", 120)
    finally:
        killed.kill()
        killed.wait()
    again = _dev(tmp_path, first_port)
    try:
        _wait_for_line(again, "one node, data in", 120)
        _create_topic(first_port, "again")
        again.send_signal(signal.SIGINT)
        _, err = again.communicate(timeout=60)
        assert again.returncode == 0, err
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()


def test_a_postgresql_stopped_under_dev_ends_it_without_a_traceback(tmp_path):
    """Ctrl-C after someone stopped the node's PostgreSQL: one line says so (pg_ctl's stop
    of a server that is not running used to end the process in a traceback)."""
    postgres = EmbeddedPostgres(tmp_path / "postgres")
    port = free_port()
    node = _dev(tmp_path, port)
    try:
        _wait_for_line(node, "one node, data in", 120)
        _create_topic(port, "before")
        postgres.stop("immediate")
        node.send_signal(signal.SIGINT)
        _, err = node.communicate(timeout=90)
        assert "had stopped already" in err
        assert "Traceback" not in err
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        if postgres.running():
            postgres.stop("immediate")
