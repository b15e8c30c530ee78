"""The report of a run: counts per anomaly class, the anomalies with ids and offsets, the fault
timeline (Markdown and JSON), and a plot of throughput and latency with the fault windows
shaded (PNG)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from chaos.checker import REPORTED, SAFETY, Anomalies, Facts, safety_failures, summary

SHOWN_PER_CLASS = 20


def fault_windows(facts: Facts) -> list[dict[str, Any]]:
    windows: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for f in facts.faults:
        if f["phase"] == "start":
            open_[f["fault"]] = {"fault": f["fault"], "start": f["t"], "detail": f["detail"]}
        else:
            w = open_.pop(f["fault"], {"fault": f["fault"], "start": f["t"], "detail": {}})
            w["end"] = f["t"]
            w["detail"] = {**w["detail"], **f.get("detail", {})}
            windows.append(w)
    for w in open_.values():
        w["end"] = facts.end_t
        windows.append(w)
    return sorted(windows, key=lambda w: w["start"])


def write_report(history_path: Path, events: list[dict[str, Any]], anomalies: Anomalies,
                 command: str) -> dict[str, Path]:
    facts = Facts.from_events(events)
    stem = history_path.name.removesuffix(".history.jsonl")
    out = history_path.parent
    windows = fault_windows(facts)
    counts = {name: len(anomalies[name]) for name in SAFETY + REPORTED}
    totals = summary(facts)
    extra = {e["type"]: e for e in events if e["type"] in ("end", "final_done")}
    worker_errors = [e for e in events if e["type"] == "worker_error"]
    worker_errors += [{"worker": e["worker"], "error": "did not stop (blocked in a client call; "
                       "stack in stuck-threads.txt)"} for e in events if e["type"] == "worker_stuck"]
    waits = [e for e in events if e["type"] == "wait_timeout"]
    result = {
        "run": facts.run,
        "command": command,
        "verdict": "FAIL" if safety_failures(anomalies) else "PASS",
        "counts": counts,
        "summary": totals,
        "fault_windows": windows,
        "anomalies": anomalies,
        "worker_errors": worker_errors,
        "wait_timeouts": waits,
        "end": extra.get("end"),
    }
    json_path = out / f"{stem}.json"
    json_path.write_text(json.dumps(result, indent=1, default=str))
    png_path = out / f"{stem}.png"
    plotted = plot(facts, windows, png_path, anomalies)

    lines = [
        f"# Chaos run {stem}",
        "",
        f"`{command}`" + (f" at commit {facts.run['commit']}" if facts.run.get("commit") else ""),
        "",
        f"Seed {facts.run.get('seed')}, {facts.run.get('duration')} s of faults "
        f"({', '.join(facts.run.get('faults', [])) or 'none'}), lease_ttl "
        f"{facts.run.get('lease_ttl')} s, coordinator_tick {facts.run.get('coordinator_tick')} s, "
        f"stall bound {facts.run.get('stall_bound')} s.",
        "",
        f"**Verdict: {result['verdict']}** ({safety_failures(anomalies)} safety anomalies)",
        "",
        "| class | count | fails the run |",
        "| --- | ---: | --- |",
    ]
    lines += [f"| {name} | {counts[name]} | yes |" for name in SAFETY]
    lines += [f"| {name} | {counts[name]} | no (reported) |" for name in REPORTED]
    lines += [
        "",
        "## Workload",
        "",
        f"{totals['sent']} sent, {totals['acknowledged']} acknowledged, {totals['failed']} failed "
        f"(client gave up), {totals['unacknowledged_but_stored']} stored without an "
        f"acknowledgement ({totals['failed_but_stored']} of them reported failed to the client), "
        f"{totals['consumer_reads']} consumer reads, {totals['offset_commits']} offset commits, "
        f"{totals['final_records']} records in the final read, {totals['faults']} faults.",
        "",
        "| producer | sent | acknowledged | failed |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, c in sorted(totals["per_producer"].items()):
        p = facts.producers.get(name, {})
        kind = "transactional" if p.get("transactional") else (
            "idempotent" if p.get("idempotent") else "not idempotent")
        label = f"{name} ({p.get('client', '?')}, {kind})"
        if p.get("transactional"):  # its messages are counted per transaction, below
            lines.append(f"| {label} | {c.get('txn_sent', 0)} in transactions | - | - |")
        else:
            lines.append(f"| {label} | {c['sent']} | {c['acked']} | {c['failed']} |")
    outcomes = totals["transactions"]
    if any(outcomes.values()):
        lines += ["", f"Transactions: {outcomes['commit']} committed, {outcomes['abort']} "
                      f"aborted, {outcomes['unknown']} undecided to the client; "
                      f"{totals['txn_final_records']} records in the read_committed final read "
                      "of their topic."]
    if worker_errors or waits:
        lines += ["", "Harness problems:", ""]
        lines += [f"- worker {e['worker']}: {e['error']}" for e in worker_errors]
        lines += [f"- gave up waiting for {e['what']} after {e['seconds']} s (t={e['t']})"
                  for e in waits]
    lines += ["", "## Anomalies", ""]
    any_shown = False
    for name in SAFETY + REPORTED:
        items = anomalies[name]
        if not items:
            continue
        any_shown = True
        lines.append(f"### {name} ({len(items)})")
        lines.append("")
        for item in items[:SHOWN_PER_CLASS]:
            lines.append(f"- `{json.dumps(item, default=str)}`")
        if len(items) > SHOWN_PER_CLASS:
            lines.append(f"- ... {len(items) - SHOWN_PER_CLASS} more in the JSON report")
        lines.append("")
    if not any_shown:
        lines += ["None.", ""]
    lines += ["## Fault timeline", "", "| start (s) | end (s) | fault | detail |",
              "| ---: | ---: | --- | --- |"]
    for w in windows:
        lines.append(f"| {w['start']:.1f} | {w['end']:.1f} | {w['fault']} | "
                     f"{json.dumps(w['detail'], default=str)} |")
    if plotted:
        lines += ["", f"![throughput and latency]({png_path.name})"]
    lines.append("")
    md_path = out / f"{stem}.md"
    md_path.write_text("\n".join(lines))
    paths = {"md": md_path, "json": json_path}
    if plotted:
        paths["png"] = png_path
    return paths


COLORS = {"kill": "tab:red", "pause": "tab:orange", "pg-restart": "tab:purple",
          "pg-pause": "tab:pink", "pg-cut": "tab:brown", "s3-errors": "tab:olive",
          "s3-slow": "tab:cyan", "s3-outage": "tab:blue", "clock-pg": "tab:gray",
          "clock-node": "tab:green"}


def plot(facts: Facts, windows: list[dict[str, Any]], path: Path,
         anomalies: Anomalies | None = None) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return False
    per_second: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    latency: dict[int, list[float]] = defaultdict(list)
    for message_id, ack in facts.acks.items():
        second = int(ack["t"])
        per_second[ack["producer"].split(".")[0]][second] += 1
        send = facts.sends.get(message_id)
        if send is not None:
            latency[second].append((ack["t"] - send["t"]) * 1000)
    reads: dict[int, int] = defaultdict(int)
    for r in facts.reads:
        reads[int(r["t"])] += 1
    end = int(facts.run.get("consume_until", facts.end_t)) + 5
    xs = list(range(end))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 7), sharex=True)
    for name, counts in sorted(per_second.items()):
        top.plot(xs, [counts.get(x, 0) for x in xs], label=f"acks/s {name}", linewidth=0.8)
    top.plot(xs, [reads.get(x, 0) for x in xs], label="group reads/s", linewidth=0.8,
             color="black", alpha=0.5)
    top.set_ylabel("messages / s")
    top.legend(loc="upper right", fontsize=7)
    lx = sorted(latency)
    p50 = [sorted(latency[x])[len(latency[x]) // 2] for x in lx]
    p99 = [sorted(latency[x])[min(len(latency[x]) - 1, int(len(latency[x]) * 0.99))] for x in lx]
    bottom.plot(lx, p50, label="ack latency p50", linewidth=0.8)
    bottom.plot(lx, p99, label="ack latency p99", linewidth=0.8)
    bottom.set_yscale("log")
    bottom.set_ylabel("send to ack (ms), by ack second")
    bottom.set_xlabel("seconds since the run started")
    bottom.legend(loc="upper right", fontsize=7)
    # safety anomalies naming a message: a red mark at its send time
    marks = sorted({facts.sends[item["id"]]["t"] for name in SAFETY
                    for item in (anomalies or {}).get(name, ())
                    if item.get("id") in facts.sends})
    if marks:
        top.plot(marks, [0] * len(marks), "rx", markersize=6, label="sent, then a safety anomaly")
        top.legend(loc="upper right", fontsize=7)
    seen = set()
    for w in windows:
        color = COLORS.get(w["fault"], "tab:gray")
        for ax in (top, bottom):
            ax.axvspan(w["start"], w["end"], color=color, alpha=0.18, linewidth=0)
        seen.add(w["fault"])
    if seen:
        fig.legend(handles=[Patch(color=COLORS.get(f, "tab:gray"), alpha=0.4, label=f)
                            for f in sorted(seen)], loc="upper center", ncol=len(seen),
                   fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
