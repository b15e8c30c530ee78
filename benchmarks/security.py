"""Produce throughput over SASL_SSL (SCRAM-SHA-512, TLS) against PLAINTEXT, in the same run
(issue 24): what authentication and encryption cost a producer.

    .venv/bin/python -m benchmarks.security [--rounds 3] [--seconds 10] [--out DIR]

One in-process node (`mink.testing.open_node`, its own PostgreSQL, file:// store) with a
PLAINTEXT and a SASL_SSL listener (test certificates from `tests/support/tls.py`, a SCRAM
user made with confluent-kafka's AdminClient). Each round runs one confluent-kafka producer
in a subprocess per listener, alternating which goes first: 1 KiB messages, acks=all,
linger.ms 5, one partition, for --seconds; the figure is the median MB/s per listener.
Writes results/security-<stamp>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import trio

RESULTS = Path(__file__).with_name("results")
USER, PASSWORD = "bench", "bench-secret"

# The producer, in its own process so that the node's event loop has the core it would have.
PRODUCER = r"""
import json, sys, time
from confluent_kafka import Producer
conf, topic, seconds = json.loads(sys.argv[1]), sys.argv[2], float(sys.argv[3])
producer = Producer({**conf, "acks": "all", "linger.ms": 5, "queue.buffering.max.kbytes": 65536})
value = b"x" * 1024
acked = [0]
def done(err, msg):
    if err is None:
        acked[0] += 1
start = time.monotonic()
while time.monotonic() - start < seconds:
    try:
        producer.produce(topic, value, on_delivery=done)
    except BufferError:
        producer.poll(0.001)
    producer.poll(0)
producer.flush(60)
elapsed = time.monotonic() - start
print(json.dumps({"messages": acked[0], "seconds": elapsed}))
"""


def produce(conf: dict, topic: str, seconds: float) -> dict:
    done = subprocess.run([sys.executable, "-c", PRODUCER, json.dumps(conf), topic,
                           str(seconds)], capture_output=True, text=True,
                          timeout=seconds + 120, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["mb_per_s"] = result["messages"] * 1024 / result["seconds"] / 1e6
    return result


async def measure(rounds: int, seconds: float) -> dict[str, list[dict]]:
    from mink.testing import open_node
    from tests.support.security import create_users
    from tests.support.tls import make_certs

    with tempfile.TemporaryDirectory(prefix="mink-secbench-") as tmp:
        certs = make_certs(Path(tmp) / "certs")
        async with open_node(listeners="PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                             ssl_cert_file=str(certs.server_cert),
                             ssl_key_file=str(certs.server_key)) as node:
            where = {n: f"{h}:{p}" for n, _, h, p in node.node.endpoints}
            await trio.to_thread.run_sync(create_users, where["PLAINTEXT"], {USER: PASSWORD})
            confs = {
                "PLAINTEXT": {"bootstrap.servers": where["PLAINTEXT"]},
                "SASL_SSL": {"bootstrap.servers": where["SASL_SSL"],
                             "security.protocol": "SASL_SSL",
                             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
                             "sasl.password": PASSWORD, "ssl.ca.location": str(certs.ca)},
            }
            runs: dict[str, list[dict]] = {name: [] for name in confs}
            for i in range(rounds):
                order = list(confs) if i % 2 == 0 else list(reversed(confs))
                for name in order:
                    runs[name].append(await trio.to_thread.run_sync(
                        produce, confs[name], f"bench-{name.lower()}", seconds))
            return runs


def summary(runs: dict[str, list[dict]]) -> dict[str, float]:
    medians = {name: statistics.median(r["mb_per_s"] for r in rs) for name, rs in runs.items()}
    medians["sasl_ssl_vs_plaintext_pct"] = (
        100.0 * (medians["SASL_SSL"] / medians["PLAINTEXT"] - 1) if medians["PLAINTEXT"] else 0)
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.security")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    runs = trio.run(measure, args.rounds, args.seconds)
    result = {"rounds": args.rounds, "seconds": args.seconds, "runs": runs,
              "summary": summary(runs)}
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"security-{stamp}.json").write_text(json.dumps(result, indent=2))
    s = result["summary"]
    lines = [f"# Produce throughput, SASL_SSL (SCRAM-SHA-512) vs PLAINTEXT ({stamp})", "",
             f"{args.rounds} rounds of {args.seconds:.0f} s per listener, alternating; "
             "1 KiB messages, acks=all, linger.ms 5, one partition, one in-process node.", "",
             "| listener | median MB/s | runs |", "| --- | --- | --- |"]
    for name in ("PLAINTEXT", "SASL_SSL"):
        lines.append(f"| {name} | {s[name]:.1f} | "
                     + ", ".join(f"{r['mb_per_s']:.1f}" for r in runs[name]) + " |")
    lines += ["", f"SASL_SSL vs PLAINTEXT: {s['sasl_ssl_vs_plaintext_pct']:+.1f}%"]
    (args.out / f"security-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
