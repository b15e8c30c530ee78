"""`mink users`: SCRAM users written into PostgreSQL from the command line (the first user of
a cluster whose clients must all authenticate), used at once by a SASL client."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from tests.support.security import endpoints


@pytest.fixture
async def sasl_node(mink_postgres, store_url):
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                         connection_failed_authentication_delay_ms=10) as running:
        yield running


def _mink(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mink.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def _metadata_as(bootstrap: str, user: str, password: str) -> str | None:
    """None when the login works, else librdkafka's error."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
                         "sasl.password": password})
    try:
        admin.list_topics(timeout=8)
        return None
    except KafkaException as exc:
        return str(exc)


async def test_mink_users_add_list_delete(sasl_node):
    url = sasl_node.postgres_url
    bootstrap = endpoints(sasl_node)["SASL_PLAINTEXT"]
    done = await trio.to_thread.run_sync(lambda: _mink(
        "users", "add", "root", "--postgres-url", url, stdin="s3cret\n"))
    assert done.returncode == 0, done.stderr
    assert await trio.to_thread.run_sync(_metadata_as, bootstrap, "root", "s3cret") is None
    listed = await trio.to_thread.run_sync(lambda: _mink(
        "users", "list", "--postgres-url", url))
    assert listed.stdout.split() == ["root", "SCRAM-SHA-256(8192)", "SCRAM-SHA-512(8192)"]
    done = await trio.to_thread.run_sync(lambda: _mink(
        "users", "delete", "root", "--postgres-url", url))
    assert done.returncode == 0, done.stderr
    assert await trio.to_thread.run_sync(_metadata_as, bootstrap, "root", "s3cret") is not None
    done = await trio.to_thread.run_sync(lambda: _mink(
        "users", "delete", "root", "--postgres-url", url))
    assert done.returncode == 1


async def test_mink_topics_and_quotas_over_sasl_ssl(mink_postgres, store_url, tmp_path):
    """The tools reach a SASL_SSL listener with --command-config (librdkafka's property
    names), with SCRAM-SHA-512 and PLAIN; a wrong password is reported, not a crash."""
    from mink.testing import open_node
    from tests.support.security import create_users, security_settings
    from tests.support.tls import make_certs

    certs = make_certs(tmp_path / "certs")
    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         **security_settings(certs)) as running:
        where = endpoints(running)
        await trio.to_thread.run_sync(create_users, where["PLAINTEXT"], {"ops": "ops-pw"})

        def props(mechanism: str, password: str = "ops-pw") -> str:
            path = tmp_path / f"{mechanism}-{password}.properties"
            path.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism={mechanism}\n"
                            f"sasl.username=ops\nsasl.password={password}\n"
                            f"ssl.ca.location={certs.ca}\n")
            return str(path)

        bootstrap = where["SASL_SSL"]
        done = await trio.to_thread.run_sync(lambda: _mink(
            "topics", "create", "secured", "--partitions", "2", "--bootstrap-server",
            bootstrap, "--command-config", props("SCRAM-SHA-512")))
        assert done.returncode == 0, done.stderr
        listed = await trio.to_thread.run_sync(lambda: _mink(
            "topics", "list", "--bootstrap-server", bootstrap, "--command-config",
            props("PLAIN")))
        assert "secured" in listed.stdout.split(), listed
        quotas = await trio.to_thread.run_sync(lambda: _mink(
            "quotas", "describe", "--bootstrap-server", bootstrap, "--command-config",
            props("SCRAM-SHA-512")))
        assert quotas.returncode == 0, quotas.stderr
        wrong = await trio.to_thread.run_sync(lambda: _mink(
            "topics", "list", "--bootstrap-server", bootstrap, "--command-config",
            props("SCRAM-SHA-512", "nope")))
        assert wrong.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in wrong.stderr, wrong
