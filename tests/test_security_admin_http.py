"""Key lookups on the admin HTTP listener with the authorizer on (mink/broker/admin/auth.py),
over real HTTPS on a two-node cluster (admin_listener = https://..., the Kafka listeners'
certificate): no or wrong credentials 401, a user without READ 403, 200 once granted;
through the node that does not lead the partition (forwarded to the leader over HTTPS as
the inter-broker user, carrying the principal) with the same rights; a carried principal
believed only from a principal with CLUSTER_ACTION; health and metrics open; `mink get
--user` over https:// with --ca-file. Over plain HTTP a secured node does not forward (the
inter-broker password would cross the network in cleartext), and `mink get` does not send a
password over plain HTTP to another host."""

from __future__ import annotations

import base64
import http.client
import logging
import os
import ssl
import sys

import trio

from tests.support.security import endpoints
from tests.support.tls import make_certs
from tests.test_acls import binding, create_acls
from tests.test_security_envelope import SETTINGS, USERS, setup

FAST = dict(kv_snapshot_records=1_000, kv_snapshot_interval_ms=500,
            log_cleaner_backoff_ms=-1, tiering_delay_ms=1000)
KEY_PATH = "/kv/table/0/k1"


def get(address: tuple, path: str, user: str | None = None,
        password: str | None = None, headers: dict | None = None):
    """Blocking: (status, headers, body) of one GET; `address` is (host, port) for HTTP,
    (host, port, ssl context) for HTTPS."""
    sent = dict(headers or {})
    if user is not None:
        sent["Authorization"] = "Basic " + base64.b64encode(
            f"{user}:{password if password is not None else USERS[user]}".encode()).decode()
    if len(address) == 3:
        host, port, context = address
        connection = http.client.HTTPSConnection(host, port, timeout=30, context=context)
    else:
        connection = http.client.HTTPConnection(*address, timeout=30)
    try:
        connection.request("GET", path, headers=sent)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


async def status_of(address, path=KEY_PATH, *args, **kwargs) -> int:
    """The status, once the partition's tablet has loaded (no 503)."""
    with trio.fail_after(30):
        while True:
            status, _, _ = await trio.to_thread.run_sync(
                lambda: get(address, path, *args, **kwargs))
            if status != 503:
                return status
            await trio.sleep(0.1)


def produce(address: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address})
    for i in range(3):
        producer.produce("table", key=b"k%d" % i, value=b"v%d" % i, partition=0)
        producer.produce("secret", key=b"k%d" % i, value=b"s%d" % i, partition=0)
    assert producer.flush(30) == 0


async def tables(cluster) -> tuple:
    """The compacted topics `table` and `secret` with three keys each, alice's users and
    the inter-broker user's CLUSTER_ACTION; (the leader of table, the other node)."""
    where = endpoints(cluster.nodes[0])
    await setup(where["PLAINTEXT"])
    for name in ("table", "secret"):
        await cluster.create_topic(name, 1, {"cleanup.policy": "compact"})
    leaders = await cluster.wait_led("table")
    await cluster.wait_led("secret")
    await trio.to_thread.run_sync(produce, where["PLAINTEXT"])
    return cluster.node(leaders[0]), cluster.node(2 if leaders[0] == 1 else 1)


async def test_lookups_over_https_authenticate_and_need_read(mink_postgres, tmp_path):
    from mink.testing import open_cluster

    certs = make_certs(tmp_path / "certs")
    async with open_cluster(2, mink_postgres, proxy=False,
                            admin_listener="https://127.0.0.1:0",
                            ssl_cert_file=str(certs.server_cert),
                            ssl_key_file=str(certs.server_key), ssl_ca_file=str(certs.ca),
                            **SETTINGS, **FAST) as cluster:
        where = endpoints(cluster.nodes[0])
        leader, other = await tables(cluster)
        context = ssl.create_default_context(cafile=str(certs.ca))
        at_leader, at_other = ((*n.node.admin_address, context) for n in (leader, other))

        # TLS only: a plaintext request gets no answer, and the listener serves on
        plain = leader.node.admin_address
        try:
            answer = await trio.to_thread.run_sync(get, plain, "/healthz")
        except (http.client.HTTPException, OSError):
            answer = None
        assert answer is None, answer
        # open: health and metrics
        for path in ("/healthz", "/metrics"):
            assert (await trio.to_thread.run_sync(get, at_leader, path))[0] == 200
        # no credentials, a wrong password, an unknown user: 401
        status, headers, _ = await trio.to_thread.run_sync(get, at_leader, KEY_PATH)
        assert status == 401 and headers["www-authenticate"].startswith("Basic")
        assert await status_of(at_leader, KEY_PATH, "alice", "wrong") == 401
        assert await status_of(at_leader, KEY_PATH, "mallory", "x") == 401
        # alice without READ: 403, on either node
        assert await status_of(at_leader, KEY_PATH, "alice") == 403
        assert await status_of(at_other, KEY_PATH, "alice") == 403
        await trio.to_thread.run_sync(create_acls, where["PLAINTEXT"], [
            binding("TOPIC", "table", "User:alice", "READ")])
        with trio.fail_after(10):  # the ACL reaches both nodes
            while (await status_of(at_leader, KEY_PATH, "alice"),
                   await status_of(at_other, KEY_PATH, "alice")) != (200, 200):
                await trio.sleep(0.1)
        status, _, body = await trio.to_thread.run_sync(get, at_other, KEY_PATH, "alice")
        assert status == 200 and b'"value":"v1"' in body
        # forwarding keeps the principal's rights: bob, and alice on another topic
        assert await status_of(at_other, KEY_PATH, "bob") == 403
        assert await status_of(at_other, "/kv/secret/0/k1", "alice") == 403

        # The leader believes a carried principal from the inter-broker user (CLUSTER_ACTION)
        # and checks that principal's READ itself
        carried = {"x-mink-principal": "User:alice"}
        assert await status_of(at_leader, KEY_PATH, "broker", headers=carried) == 200
        assert await status_of(at_leader, "/kv/secret/0/k1", "broker",
                               headers=carried) == 403
        assert await status_of(at_leader, KEY_PATH, "broker",
                               headers={"x-mink-principal": "User:bob"}) == 403
        # ... and from no one else: a spoofed header gains nothing
        super_user = {"x-mink-principal": "User:ANONYMOUS"}
        assert await status_of(at_leader, "/kv/secret/0/k1", "alice",
                               headers=super_user) == 403
        assert await status_of(at_leader, "/kv/secret/0/k1", headers=super_user) == 401
        assert await status_of(at_other, "/kv/secret/0/k1", "alice",
                               headers=super_user) == 403
        # the old marker only keeps the lookup from being forwarded
        assert await status_of(at_other, KEY_PATH, "alice",
                               headers={"x-mink-forwarded": "1"}) == 421
        assert await status_of(at_other, "/kv/secret/0/k1",
                               headers={"x-mink-forwarded": "1"}) == 401

        # mink get over https://, the password from the environment, through the other
        # node (forwarded over HTTPS)
        https, ca = f"https://{at_other[0]}:{at_other[1]}", ("--ca-file", str(certs.ca))
        code, out, err = await mink_get(https, "table", "k1", "--user", "alice", *ca,
                                        env={"MINK_PASSWORD": USERS["alice"]})
        assert (code, out) == (0, b"v1\n"), err
        code, _, err = await mink_get(https, "table", "k1", *ca)
        assert code == 4 and "401" in err, err
        code, _, err = await mink_get(https, "secret", "k1", "--user", "alice",
                                      "--password", USERS["alice"], *ca)
        assert code == 4 and "403" in err, err
        # the node's certificate is checked: not by the system's CAs
        code, _, err = await mink_get(https, "table", "k1", "--user", "alice",
                                      "--password", USERS["alice"])
        assert code == 2 and "CERTIFICATE_VERIFY_FAILED" in err, err


async def test_a_secured_node_does_not_forward_lookups_over_plain_http(mink_postgres,
                                                                       caplog):
    """A plain-HTTP admin listener on a node whose lookups need credentials: the lookup is
    answered where it arrives (the client's password has crossed already: said once at
    start), but not forwarded to the leader with the inter-broker password: 421, the leader
    named. `mink get` sends a password over plain HTTP to a loopback address only."""
    from mink.testing import open_cluster

    caplog.set_level(logging.WARNING, logger="mink.broker.admin.http")
    async with open_cluster(2, mink_postgres, proxy=False, admin_listener="127.0.0.1:0",
                            **SETTINGS, **FAST) as cluster:
        leader, other = await tables(cluster)
        await trio.to_thread.run_sync(create_acls, endpoints(leader)["PLAINTEXT"], [
            binding("TOPIC", "table", "User:alice", "READ")])
        at_leader, at_other = leader.node.admin_address, other.node.admin_address
        with trio.fail_after(10):  # the ACL reaches the leader
            while await status_of(at_leader, KEY_PATH, "alice") != 200:
                await trio.sleep(0.1)
        status, _, body = await trio.to_thread.run_sync(get, at_other, KEY_PATH, "alice")
        assert status == 421 and b'"leader":%d' % leader.node_id in body, (status, body)
        assert b"not forwarded" in body
        warned = [r for r in caplog.records if "plain HTTP" in r.getMessage()]
        assert len(warned) == 2, warned  # one line per node, at start
        # mink get on loopback over plain HTTP: sent (nothing crosses the network)
        code, out, err = await mink_get(at_leader, "table", "k1", "--user", "alice",
                                        "--password", USERS["alice"])
        assert (code, out) == (0, b"v1\n"), err
        code, _, err = await mink_get(at_other, "table", "k1", "--user", "alice",
                                      "--password", USERS["alice"])
        assert code == 3 and f"node {leader.node_id}" in err, err


async def test_mink_get_sends_no_password_over_plain_http_to_another_host():
    """Refused before anything is sent (192.0.2.1 is TEST-NET-1: nothing answers there), and
    before the password is asked for."""
    started = trio.current_time()
    for admin in ("192.0.2.1:9644", "http://kv.example.com:9644"):
        code, _, err = await mink_get(admin, "table", "k1", "--user", "alice")
        assert code == 2 and "refusing to send the password of alice over plain HTTP" in err, (
            admin, err)
    assert trio.current_time() - started < 20  # no connection was tried (--timeout 20 each)


async def mink_get(admin, topic: str, key: str, *extra: str, env: dict | None = None):
    """`mink get`; `admin` is an --admin string or a (host, port) address."""
    if not isinstance(admin, str):
        admin = f"{admin[0]}:{admin[1]}"
    process = await trio.run_process(
        [sys.executable, "-m", "mink.cli.main", "get", topic, key, "--admin", admin,
         "--timeout", "20", *extra],
        capture_stdout=True, capture_stderr=True, check=False, stdin=b"",
        env={**os.environ, **(env or {})})
    return process.returncode, process.stdout, process.stderr.decode()
