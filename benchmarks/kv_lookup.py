"""Key lookups over HTTP (issue 20): latency through the partition's leader and through the
other node (forwarded to the leader), in the same run; open (plain HTTP), and secured (HTTPS,
HTTP Basic and READ on the topic, mink/broker/admin/auth.py).

    python -m benchmarks.kv_lookup [--keys 20000] [--lookups 2000] [--mode both|open|secured]

Two in-process nodes (`mink.testing.open_cluster`, admin listeners on), a compacted topic of
one partition, `--keys` keys written by confluent-kafka; once the leader's tablet answers,
`--lookups` random keys are looked up one at a time with `mink get`'s own client
(`mink.cli.get.lookup`: one HTTP connection per lookup, as the CLI makes), first at the
leader, then at the other node. Each lookup waits for the tablet to reach the high
watermark it saw, so the figures include that check. Secured: the authorizer on and an
inter-broker SASL listener (so lookups need credentials), the admin listeners on https://
(test certificates from tests/support/tls.py; a secured node forwards over HTTPS only), a
SCRAM user with READ on the topic, its password checked at its first lookup and cached
(auth.CACHE_SECONDS) after; a forwarded lookup logs in to the leader as the inter-broker
user carrying the principal. Each lookup is a new connection, so secured figures include a
TLS handshake (two, through the other node).
Results: `results/kv-lookup-<ts>.json`, `.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import tempfile
import time
from pathlib import Path

import trio

from mink.cli.get import lookup
from mink.testing import open_cluster

RESULTS = Path(__file__).with_name("results")
TOPIC = "kv-lookup"


def produce(bootstrap: str, keys: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(keys):
        while True:
            try:
                producer.produce(TOPIC, key=b"key-%d" % i, value=b"value-%d" % i, partition=0)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


# Secured: a SASL listener between the nodes makes lookups need credentials (auth.py); the
# benchmark's own clients use the PLAINTEXT listener as the super user ANONYMOUS.
SECURED = dict(
    listeners="INTERNAL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
    listener_security_protocol_map="INTERNAL:SASL_PLAINTEXT,PLAINTEXT:PLAINTEXT",
    inter_broker_listener_name="INTERNAL", inter_broker_sasl_mechanism="PLAIN",
    inter_broker_sasl_username="broker", inter_broker_sasl_password="broker-pw",
    authorizer_enabled=True, super_users="User:ANONYMOUS")
READER = ("reader", "reader-pw")


def secure(bootstrap: str) -> None:
    """The SCRAM users and their ACLs: the inter-broker user may carry principals
    (CLUSTER_ACTION), the reader may read the topic."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    users = {"broker": "broker-pw", READER[0]: READER[1]}
    for future in admin.alter_user_scram_credentials([
            UserScramCredentialUpsertion(user, ScramCredentialInfo(
                ScramMechanism.SCRAM_SHA_512, 4096), password.encode())
            for user, password in users.items()]).values():
        future.result(timeout=30)
    allow = AclPermissionType.ALLOW
    for future in admin.create_acls([
            AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                       "User:broker", "*", AclOperation.CLUSTER_ACTION, allow),
            AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL,
                       f"User:{READER[0]}", "*", AclOperation.READ, allow)],
            request_timeout=20).values():
        future.result(timeout=30)


def timed_lookups(admin: str, keys: list[int], login: tuple[str, str] | None,
                  ca_file: str | None = None) -> list[float]:
    user, password = login or (None, None)
    out = []
    for i in keys:
        started = time.perf_counter()
        status, body = lookup(admin, TOPIC, 0, b"key-%d" % i, timeout=30, user=user,
                              password=password, ca_file=ca_file)
        out.append(time.perf_counter() - started)
        assert status == 200 and body["value"] == f"value-{i}", (status, body)
    return out


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {"n": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)}


async def run_mode(args, secured: bool) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        return await _run_mode(args, secured, Path(folder))


async def _run_mode(args, secured: bool, folder: Path) -> dict:
    login = READER if secured else None
    settings: dict = {"admin_listener": "127.0.0.1:0"}
    ca_file = None
    if secured:
        from tests.support.tls import make_certs

        certs = make_certs(folder / "certs")
        ca_file = str(certs.ca)
        settings = {**SECURED, "admin_listener": "https://127.0.0.1:0",
                    "ssl_cert_file": str(certs.server_cert),
                    "ssl_key_file": str(certs.server_key), "ssl_ca_file": ca_file}
    scheme = "https://" if secured else ""
    async with open_cluster(2, proxy=False, **settings) as cluster:
        bootstrap = ",".join(f"{host}:{port}" for node in cluster.nodes
                             for name, _, host, port in node.node.endpoints
                             if name == "PLAINTEXT")
        if secured:
            await trio.to_thread.run_sync(secure, bootstrap)
        await cluster.create_topic(TOPIC, 1, {"cleanup.policy": "compact"})
        await cluster.wait_led(TOPIC)
        await trio.to_thread.run_sync(produce, bootstrap, args.keys)
        # Leadership may still move while the second node joins: settle on one leader whose
        # tablet answers at both nodes (the first lookups wait out its loading, and the ACL
        # reaching both nodes, not counted).
        with trio.fail_after(60):
            while True:
                leader_id = (await cluster.wait_led(TOPIC))[0]
                admin, forwarded = (scheme + "%s:%d" % cluster.node(n).node.admin_address
                                    for n in (leader_id, 2 if leader_id == 1 else 1))
                answers = [await trio.to_thread.run_sync(
                    lambda a=a: lookup(a, TOPIC, 0, b"key-0", user=login and login[0],
                                       password=login and login[1], ca_file=ca_file))
                    for a in (admin, forwarded)]
                if all(status == 200 for status, _ in answers):
                    break
                await trio.sleep(0.5)
        if secured:  # what is measured is the secured path: no credentials, no answer
            status, _ = await trio.to_thread.run_sync(
                lambda: lookup(admin, TOPIC, 0, b"key-0", ca_file=ca_file))
            assert status == 401, status
        rng = random.Random(1)
        keys = [rng.randrange(args.keys) for _ in range(args.lookups)]
        direct = await trio.to_thread.run_sync(timed_lookups, admin, keys, login, ca_file)
        via_other = await trio.to_thread.run_sync(timed_lookups, forwarded, keys, login,
                                                  ca_file)
    return {"leader": percentiles(direct), "through_other_node": percentiles(via_other)}


async def run(args) -> dict:
    result: dict = {"keys": args.keys}
    for mode in ("open", "secured"):
        if args.mode in (mode, "both"):
            result[mode] = await run_mode(args, mode == "secured")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kv_lookup")
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--lookups", type=int, default=2_000)
    parser.add_argument("--mode", choices=("both", "open", "secured"), default="both")
    args = parser.parse_args(argv)
    result = trio.run(run, args)
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    base = RESULTS / f"kv-lookup-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(
        f"| {mode} | {name} | {r['n']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} |"
        for mode in ("open", "secured") if mode in result
        for name, r in (("at the leader", result[mode]["leader"]),
                        ("through the other node", result[mode]["through_other_node"])))
    base.with_suffix(".md").write_text(
        f"# Key lookups over HTTP: {result['keys']} keys, one compacted partition, two nodes\n\n"
        "One HTTP connection per lookup (`mink get`'s client); each waits for the tablet to "
        "reach the high watermark it saw. Secured: HTTPS (a handshake per connection), "
        "HTTP Basic (a SCRAM user, its password cached after the first check) and READ on "
        "the topic; forwarded over HTTPS as the inter-broker user.\n\n| mode | lookups | n | p50 ms | p99 ms | max ms |\n"
        "| --- | --- | ---: | ---: | ---: | ---: |\n" + rows + "\n")
    print(f"results: {base}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
