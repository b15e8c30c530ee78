"""Reports of `benchmarks.kafka`: derived figures (fractions of the baseline, targets), the
JSON file, the Markdown summary and the PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.storage import markdown_table, text_table

NOISY_OTHER_PCT = 25.0


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _loadavg(values) -> str:
    return "-" if not values else " / ".join(f"{v:.2f}" for v in values)


def _frac(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return round(value / base, 3)


# -- derived figures -------------------------------------------------------------------------


def add_derived(report: dict[str, Any]) -> None:
    """Fractions of the baseline on every throughput figure; the targets, met or not."""
    base = {k: v.get("mb_per_s") for k, v in report.get("baseline", {}).items()}
    for r in report.get("throughput", []):
        r["fraction_of_baseline"] = _frac(r.get("mb_per_s"), base.get(r["store"]))
    for r in report.get("latency", []):
        r["fraction_of_baseline"] = _frac(r.get("achieved_mb_per_s"), base.get(r["store"]))
    for r in report.get("catchup", []):
        r["fraction_of_baseline"] = _frac(r.get("mb_per_s"), base.get(r["store"]))
    cluster = report.get("cluster", {})
    if cluster.get("throughput"):
        cluster["throughput"]["fraction_of_baseline"] = _frac(
            cluster["throughput"].get("mb_per_s"), base.get("file"))
    report["target_results"] = evaluate_targets(report)


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "not met")


def evaluate_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    targets = report["targets"]
    delays = report["wal_max_delay_ms"]
    rows: list[dict[str, Any]] = []
    file_tput = [r for r in report.get("throughput", []) if r["store"] == "file"]
    for r in file_tput or [None]:
        mb = r.get("mb_per_s") if r else None
        rows.append({
            "target": "produce throughput, 1 KiB, acks=all, file://"
                      + (f", {r['partitions']} partition(s)" if r else ""),
            "threshold": f">= {targets['produce_mb_s']:g} MB/s",
            "measured": None if mb is None else f"{mb:.1f} MB/s ({r['msgs_per_s']:.0f} msgs/s)",
            "value": mb, "met": None if mb is None else mb >= targets["produce_mb_s"]})
    lat = next((r for r in report.get("latency", []) if r["store"] == "file"
                and r["offered_mb_per_s"] == targets["latency_rate_mb_s"]), None)
    limit = delays["file"] + targets["latency_p99_extra_ms"]
    if lat:
        p99 = lat["latency"].get("p99_ms")
        steady = lat["achieved_mb_per_s"] >= 0.95 * lat["offered_mb_per_s"]
        ok = p99 is not None and p99 <= limit and steady
        measured = (f"p99 {p99} ms (p50 {lat['latency'].get('p50_ms')}, p99.9 "
                    f"{lat['latency'].get('p999_ms')}) at {lat['achieved_mb_per_s']} MB/s achieved")
    else:
        ok, measured, p99 = None, None, None
    rows.append({"target": f"produce latency p99 at a steady {targets['latency_rate_mb_s']:g} "
                           "MB/s, file://",
                 "threshold": f"<= wal.max_delay ({delays['file']:g} ms) + "
                              f"{targets['latency_p99_extra_ms']:g} ms = {limit:g} ms",
                 "measured": measured, "value": p99, "met": ok})
    e2e = next((r for r in report.get("e2e", []) if r["store"] == "file"), None)
    limit = delays["file"] + targets["e2e_p99_extra_ms"]
    if e2e:
        p99 = e2e["latency"].get("p99_ms")
        complete = e2e["consume"]["received"] >= e2e["produce"]["acked"]
        ok = p99 is not None and p99 <= limit and complete
        measured = (f"p99 {p99} ms (p50 {e2e['latency'].get('p50_ms')}) at "
                    f"{e2e['rate_mb_s']:g} MB/s; {e2e['consume']['received']}/"
                    f"{e2e['produce']['acked']} messages seen")
    else:
        ok, measured, p99 = None, None, None
    rows.append({"target": "end-to-end latency p99 (tailing consumer), file://",
                 "threshold": f"<= wal.max_delay ({delays['file']:g} ms) + "
                              f"{targets['e2e_p99_extra_ms']:g} ms = {limit:g} ms",
                 "measured": measured, "value": p99, "met": ok})
    catchups = [r for r in report.get("catchup", []) if r["store"] == "file"]
    for r in catchups or [None]:
        mb = r.get("mb_per_s") if r else None
        complete = bool(r) and r["received"] >= r["expected"]
        rows.append({
            "target": "consumer catch-up, caches cold, file://"
                      + (f" ({r['variant']})" if r else ""),
            "threshold": f">= {targets['catchup_mb_s']:g} MB/s",
            "measured": None if mb is None else f"{mb:.1f} MB/s ({r['received']}/"
                                                f"{r['expected']} messages)",
            "value": mb,
            "met": None if mb is None else (mb >= targets["catchup_mb_s"] and complete)})
    for row in rows:
        row["verdict"] = _verdict(row["met"])
    return rows


# -- tables ----------------------------------------------------------------------------------


def _cpu(c: dict[str, Any] | None, keys=("node_pct", "postgres_pct", "moto_pct",
                                         "loadgen_pct", "kernel_pct", "other_pct")) -> str:
    if not c:
        return "-"
    return "/".join(_fmt(c.get(k), 0) for k in keys)


def _gc(c: dict[str, Any] | None) -> str:
    g = (c or {}).get("node_gc")
    if not g:
        return "-"
    return f"{g['gen2_count']}/{g['gen2_max_ms']:.0f}"


def targets_table(report):
    head = ["target", "threshold", "measured", "verdict"]
    rows = [[t["target"], t["threshold"], t["measured"] or "-", f"**{t['verdict']}**"]
            for t in report.get("target_results", [])]
    return head, rows


def baseline_table(report):
    head = ["store", "MB/s", "objects (1 MiB)", "uploads in flight", "upload mean ms",
            "upload p99 ms", "upload max ms", "cpu server/pg/moto/client/kernel/other %"]
    rows = []
    for name, r in report.get("baseline", {}).items():
        server = r.get("server", {})
        rows.append([name, _fmt(r["mb_per_s"]), str(r["chunks_written"]),
                     str(r["uploads_in_flight"]), _fmt(server.get("upload_mean_ms"), 2),
                     _fmt(server.get("upload_p99_ms"), 1), _fmt(server.get("upload_max_ms"), 1),
                     _cpu(r.get("cpu"))])
    return head, rows


def throughput_table(report):
    head = ["store", "partitions", "MB/s", "msgs/s", "x baseline", "sent", "acked", "errors",
            "node RSS MiB", "node gen2 GCs/max ms", "cpu node/pg/moto/loadgen/kernel/other %"]
    rows = []
    for r in report.get("throughput", []):
        rows.append([r["store"], str(r["partitions"]), _fmt(r["mb_per_s"]),
                     _fmt(r["msgs_per_s"], 0), _fmt(r.get("fraction_of_baseline"), 2),
                     str(r["sent"]), str(r["acked"]),
                     str(sum(r["errors"].values()) + r.get("not_delivered", 0)),
                     _fmt((r.get("node_rss_mib") or [None])[0], 0), _gc(r.get("cpu")),
                     _cpu(r.get("cpu"))])
    c = report.get("cluster", {}).get("throughput")
    if c:
        rows.append([f"file, {report['cluster']['nodes']} nodes", str(c["partitions"]),
                     _fmt(c["mb_per_s"]), _fmt(c["msgs_per_s"], 0),
                     _fmt(c.get("fraction_of_baseline"), 2), str(c["sent"]), str(c["acked"]),
                     str(sum(c["errors"].values()) + c.get("not_delivered", 0)),
                     "/".join(_fmt(x, 0) for x in c.get("node_rss_mib") or []),
                     _gc(c.get("cpu")), _cpu(c.get("cpu"))])
    return head, rows


def latency_table(report):
    head = ["store", "wal.max_delay ms", "offered MB/s", "achieved MB/s", "acked", "p50 ms",
            "p90 ms", "p99 ms", "p99.9 ms", "max ms", "send lag p99 ms", "errors",
            "node gen2 GCs/max ms", "cpu node/pg/moto/loadgen/kernel/other %"]
    rows = []
    for r in report.get("latency", []):
        lat = r["latency"]
        rows.append([r["store"], _fmt(r["wal_max_delay_ms"], 0), _fmt(r["offered_mb_per_s"], 0),
                     _fmt(r["achieved_mb_per_s"], 2), str(r["acked"]), _fmt(lat.get("p50_ms")),
                     _fmt(lat.get("p90_ms")), _fmt(lat.get("p99_ms")), _fmt(lat.get("p999_ms")),
                     _fmt(lat.get("max_ms")), _fmt(r["schedule_lag"].get("p99_ms"), 2),
                     str(sum(r["errors"].values()) + r.get("not_delivered", 0)),
                     _gc(r.get("cpu")), _cpu(r.get("cpu"))])
    return head, rows


def e2e_table(report):
    head = ["store", "rate MB/s", "received/acked", "e2e p50 ms", "e2e p90 ms", "e2e p99 ms",
            "e2e p99.9 ms", "e2e max ms", "produce p50 ms", "produce p99 ms",
            "node gen2 GCs/max ms", "cpu node/pg/moto/loadgens/kernel/other %"]
    rows = []
    for r in report.get("e2e", []):
        lat, prod = r["latency"], r["produce"]["latency"]
        rows.append([r["store"], _fmt(r["rate_mb_s"], 0),
                     f"{r['consume']['received']}/{r['produce']['acked']}",
                     _fmt(lat.get("p50_ms")), _fmt(lat.get("p90_ms")), _fmt(lat.get("p99_ms")),
                     _fmt(lat.get("p999_ms")), _fmt(lat.get("max_ms")),
                     _fmt(prod.get("p50_ms")), _fmt(prod.get("p99_ms")), _gc(r.get("cpu")),
                     _cpu(r.get("cpu"))])
    return head, rows


def catchup_table(report):
    head = ["store", "variant", "MB", "MB/s", "msgs/s", "x baseline", "first message s",
            "received/expected", "consumer cpu %", "node gen2 GCs/max ms",
            "cpu node/pg/moto/loadgen/kernel/other %", "iowait %"]
    rows = []
    for r in report.get("catchup", []):
        rows.append([r["store"], r["variant"] + ("" if r["page_cache_dropped"] or "dropped" not in
                                                  r["variant"] else " (drop refused)"),
                     _fmt(r["written_mb"], 0), _fmt(r["mb_per_s"]), _fmt(r["msgs_per_s"], 0),
                     _fmt(r.get("fraction_of_baseline"), 2), _fmt(r["first_message_s"], 2),
                     f"{r['received']}/{r['expected']}", _fmt(r["client_cpu_pct"], 0),
                     _gc(r.get("cpu")), _cpu(r.get("cpu")), _fmt(r.get("cpu", {}).get("iowait_pct"), 0)])
    return head, rows


def stalls_table(report):
    """Per case: the node's task steps over the threshold (`--stalls`), the longest ones."""
    head = ["case", "steps", "total ms", "max ms", "longest (ms task @ where)"]
    rows = []

    def add(label, cpu):
        st = (cpu or {}).get("node_stalls")
        if st is None:
            return
        longest = "; ".join(f"{x['ms']:.0f} {x['task'].rsplit('.', 1)[-1]} @ {x['stopped_at']}"
                            for x in st["longest"][:3])
        rows.append([label, str(st["count"]), _fmt(st["total_ms"]), _fmt(st["max_ms"]),
                     longest or "-"])

    for r in report.get("throughput", []):
        add(f"throughput {r['store']} {r['partitions']}p", r.get("cpu"))
    for r in report.get("latency", []):
        add(f"latency {r['store']} {r['offered_mb_per_s']:g} MB/s", r.get("cpu"))
    for r in report.get("e2e", []):
        add(f"e2e {r['store']}", r.get("cpu"))
    for r in report.get("catchup", []):
        add(f"catch-up {r['variant']}", r.get("cpu"))
    c = report.get("cluster", {}).get("throughput")
    if c:
        add("3 nodes throughput", c.get("cpu"))
    return head, rows


def noisy(report) -> list[str]:
    out = []

    def check(label, cpu):
        if cpu and cpu.get("other_pct", 0) >= NOISY_OTHER_PCT:
            out.append(f"{label} ({cpu['other_pct']:.0f}%)")

    for r in report.get("throughput", []):
        check(f"throughput {r['store']} {r['partitions']}p", r.get("cpu"))
    for r in report.get("latency", []):
        check(f"latency {r['store']} {r['offered_mb_per_s']:g} MB/s", r.get("cpu"))
    for r in report.get("e2e", []):
        check(f"e2e {r['store']}", r.get("cpu"))
    for r in report.get("catchup", []):
        check(f"catch-up {r['variant']}", r.get("cpu"))
    for name, r in report.get("baseline", {}).items():
        check(f"baseline {name}", r.get("cpu"))
    return out


# -- Markdown --------------------------------------------------------------------------------


def markdown(report: dict[str, Any], json_name: str, plots: list[str]) -> str:
    cfg, machine = report["config"], report["machine"]
    md = [f"# Mink Kafka benchmark, {report['started_at']}", ""]
    md.append(f"`{report['command']}`, {report['mode']} mode, {report['total_seconds']:.0f} s in "
              f"all. Raw figures: `{json_name}`. What each figure means: "
              "`benchmarks/README.md`.")
    md.append("")
    if report.get("interrupted"):
        md += ["**Interrupted**: partial results.", ""]
    md.append(f"Machine: {machine.get('nproc')} CPUs ({machine.get('cpu_model', '?')}), "
              f"{machine.get('memory_mib')} MiB, Python {machine['python']}, git "
              f"{machine.get('git_commit')}{' (dirty)' if machine.get('git_dirty') else ''}"
              + (f", {len(machine['git_untracked_under_mink'])} untracked files under mink/"
                 if machine.get("git_untracked_under_mink") else "")
              + (f", modified under mink/: {', '.join(machine['git_modified_under_mink'])} "
                 f"(diff {machine.get('git_diff_mink_sha1')})"
                 if machine.get("git_modified_under_mink") else "")
              + ". Nodes, PostgreSQL, moto and the load generators share these CPUs. Load "
              f"average at the start {_loadavg(machine.get('loadavg_at_start'))}, at the end "
              f"{_loadavg(machine.get('loadavg_at_end'))}.")
    md.append("")
    md += ["## Targets", "", markdown_table(*targets_table(report)), ""]
    md.append("MB = 10^6 bytes of message values (1 KiB each) acknowledged or consumed. "
              "cpu columns: percent of one core used by the node(s), PostgreSQL, moto, the "
              "load generator process(es), kernel threads (page writeback, the filesystem "
              "journal) and everything else on the machine (other: processes outside this "
              "benchmark; 25% or more flags a noisy case below).")
    md.append("")
    if report.get("baseline"):
        md += ["## Baseline: socket -> trio -> object store, no Mink", ""]
        md.append(f"One client process sends length-prefixed {cfg['baseline_chunk_bytes'] // 1024} "
                  f"KiB chunks as fast as it can for {cfg['baseline_seconds']:g} s to a trio "
                  "server process that writes each chunk as one object with mink's object "
                  "store (file:// with fsync; S3 through trio_asyncio), with as many writes in "
                  "flight as a node's WAL uploads.")
        md += ["", markdown_table(*baseline_table(report)), ""]
    if report.get("throughput"):
        md += ["## 1. Produce throughput (closed loop)", ""]
        pc = cfg["producer_throughput"]
        md.append(f"One confluent-kafka producer process, {cfg['value_bytes']} B values, "
                  f"{cfg['throughput_seconds']:g} s per case, producer settings "
                  f"`{json.dumps(pc)}`. MB/s and msgs/s: acknowledged values from the first "
                  "send to the last delivery report.")
        md += ["", markdown_table(*throughput_table(report)), ""]
    if report.get("latency"):
        md += ["## 2. Produce latency at fixed rates (open loop)", ""]
        md.append(f"Sends paced in 1 ms slices whatever the acks do, {cfg['latency_partitions']} "
                  f"partitions, {cfg['latency_seconds']:g} s per rate"
                  + (f" after {cfg['latency_warmup_seconds']:g} s at the rate, unmeasured"
                     if cfg.get("latency_warmup_seconds") else "")
                  + ", producer settings "
                  f"`{json.dumps(cfg['producer_latency'])}`. Latency: delivery report - "
                  "produce() call, in the producer process.")
        md += ["", markdown_table(*latency_table(report)), ""]
    if report.get("e2e"):
        md += ["## 3. End-to-end latency (tailing consumer)", ""]
        md.append("A paced producer and a consumer (assign() at the end of every partition) in "
                  "two more processes; the value's first 8 bytes carry the send time; latency: "
                  "the consumer's poll hands the message over - send time. Consumer settings "
                  f"`{json.dumps(cfg['consumer_tail'])}`.")
        md += ["", markdown_table(*e2e_table(report)), ""]
    if report.get("catchup"):
        md += ["## 4. Consumer catch-up, caches cold", ""]
        md.append(f"{cfg['catchup_mb']} MB written to {cfg['catchup_partitions']} partitions, "
                  "the node restarted (its tail and block caches empty), then one consumer "
                  "reads everything from offset 0 as fast as it can; the second row also drops "
                  "the OS page cache first (`/proc/sys/vm/drop_caches`), so the file:// store "
                  f"reads from disk. Consumer settings `{json.dumps(cfg['consumer_catchup'])}`.")
        md += ["", markdown_table(*catchup_table(report)), ""]
    scale = report.get("scale") or {}
    if scale.get("metadata") or scale.get("create_topics_s") is not None:
        md += ["## 5. Scale on one node", ""]
        total = scale["topics"] * scale["partitions_per_topic"]
        m = scale.get("metadata", {})
        c = scale.get("connections", {})
        lines = [
            f"- {scale['topics']} topics x {scale['partitions_per_topic']} partitions = "
            f"{total} partitions, created with one AdminClient.create_topics in "
            f"{_fmt(scale.get('create_topics_s'), 2)} s; every partition open (Metadata "
            f"without errors) {_fmt(scale.get('all_open_s'), 1)} s after the request "
            f"(node cpu during that: {_fmt(scale.get('create_cpu', {}).get('node_pct'), 0)}%, "
            f"PostgreSQL {_fmt(scale.get('create_cpu', {}).get('postgres_pct'), 0)}%).",
            f"- Node cpu once every partition was open, second by second (no client "
            f"load): {[x[0] for x in scale.get('idle_cpu_series', [])]} % of one core, "
            f"PostgreSQL {[x[1] for x in scale.get('idle_cpu_series', [])]} %; mean of the "
            f"last 5 s: node {_fmt(scale.get('idle_cpu_last5s', {}).get('node_pct'))}%, "
            f"PostgreSQL {_fmt(scale.get('idle_cpu_last5s', {}).get('postgres_pct'))}%.",
            f"- Metadata v12 for every topic ({m.get('partitions')} partitions, "
            f"{_fmt((m.get('response_bytes') or 0) / 1e6, 2)} MB response), raw client: "
            f"uncached (the first after a topic was added, so encoded anew) "
            f"{[u['ms'] for u in scale.get('metadata_uncached', [])]} ms (median "
            f"{_fmt(scale.get('metadata_uncached_ms', {}).get('median'))} ms; node gen2 GC "
            f"pauses during each: {[u['gen2_gc_ms_during'] for u in scale.get('metadata_uncached', [])]}"
            f" ms); repeated (cached) p50 {_fmt(m.get('repeated_p50_ms'))} ms, max "
            f"{_fmt(m.get('repeated_max_ms'))} ms over {m.get('repeated_n')}; "
            f"AdminClient.list_topics() (librdkafka's own Metadata version, so encoded once "
            f"more the first time; librdkafka parses, Python objects built): "
            f"{m.get('admin_list_topics_ms')} ms.",
            f"- Node garbage collector: {scale.get('node_gc_since_start', {}).get('gen2_count')} "
            f"full (gen2) collections since start, median "
            f"{_fmt(scale.get('node_gc_since_start', {}).get('gen2_median_ms'))} ms, max "
            f"{_fmt(scale.get('node_gc_since_start', {}).get('gen2_max_ms'))} ms (each one stops "
            "the event loop).",
            f"- Node RSS: {_fmt(scale.get('rss_idle_mib'))} MiB idle, "
            f"{_fmt(scale.get('rss_partitions_mib'))} MiB with the partitions open, "
            f"{_fmt(scale.get('rss_after_metadata_mib'))} MiB after the Metadata requests, "
            f"{_fmt(scale.get('rss_connections_mib'))} MiB with {c.get('count')} idle "
            f"connections, {_fmt(scale.get('rss_after_connections_closed_mib'))} MiB after "
            f"they closed (peak {_fmt(scale.get('rss_peak_mib'))} MiB).",
            f"- {c.get('count')} connections, each after one ApiVersions: opened in "
            f"{_fmt(c.get('open_all_seconds'), 2)} s, {c.get('alive_after')} still answering "
            f"at the end; node cpu while they sat idle "
            f"{_fmt(scale.get('connections_idle_cpu', {}).get('node_pct'))}%; ApiVersions "
            f"round trip on another connection p50 {_fmt(c.get('api_versions_rtt_before_p50_ms'), 3)}"
            f" ms before, {_fmt(c.get('api_versions_rtt_held_p50_ms'), 3)} ms while they are "
            "held.",
        ]
        md += lines + [""]
    cluster = report.get("cluster") or {}
    if cluster.get("throughput") or cluster.get("failover"):
        md += ["## 6. Three nodes", ""]
        t = cluster.get("throughput", {})
        f = cluster.get("failover", {})
        md.append(f"- {cluster['nodes']} nodes (lease_ttl {cluster['lease_ttl_s']:g} s, "
                  f"coordinator_tick {cluster['coordinator_tick_s']:g} s), one file:// store, "
                  f"a {cluster['partitions']}-partition topic led by "
                  f"{cluster.get('leaders')} (partition: node).")
        if t:
            md.append(f"- Aggregate produce throughput: {_fmt(t.get('mb_per_s'))} MB/s, "
                      f"{_fmt(t.get('msgs_per_s'), 0)} msgs/s "
                      f"({_fmt(t.get('fraction_of_baseline'), 2)} x the file baseline); cpu "
                      f"of the three nodes together {_fmt(t.get('cpu', {}).get('node_pct'), 0)}% "
                      f"of one core, PostgreSQL {_fmt(t.get('cpu', {}).get('postgres_pct'), 0)}%, "
                      f"load generator {_fmt(t.get('cpu', {}).get('loadgen_pct'), 0)}%.")
        if f:
            md.append(f"- Failover: SIGKILL of node {cluster.get('failover_victim')} (leader of "
                      f"partitions {cluster.get('failover_partitions')}) while an idempotent "
                      f"producer sends one message every {cfg['failover_interval_ms']} ms to "
                      "each of them. From the kill: node expired in PostgreSQL "
                      f"{_fmt(f.get('node_expired_s'), 2)} s, partitions re-led "
                      f"{_fmt(f.get('partitions_releaded_s'), 2)} s, open on their new leader "
                      f"{_fmt(f.get('partitions_open_s'), 2)} s, shown with their new leader "
                      "in a surviving node's Metadata "
                      f"{_fmt(f.get('survivor_metadata_moved_s'), 2)} s, **first acknowledged produce "
                      f"(sent after the kill) to one of them {_fmt(f.get('first_produce_after_kill_s'), 2)} "
                      f"s**, to all of them {_fmt(f.get('all_partitions_after_kill_s'), 2)} s "
                      f"(by partition: {f.get('first_ack_after_kill_by_partition_s')}). "
                      f"Delivery errors: {f.get('errors') or 'none'}.")
        md.append("")
    if cfg.get("stall_ms"):
        md += [f"## Event-loop stalls (task steps of {cfg['stall_ms']:g} ms or more)", ""]
        md += [markdown_table(*stalls_table(report)), ""]
    for plot in plots:
        md.append(f"![{plot}]({plot})")
        md.append("")
    bad = noisy(report)
    if bad:
        md.append(f"**Noisy run**: other processes used {NOISY_OTHER_PCT:g}% of a core or more "
                  f"during {', '.join(bad)}.")
        md.append("")
    if report.get("errors"):
        md += ["## Errors", ""]
        for e in report["errors"]:
            md.append(f"- {e['scenario']}: `{e['error']}`")
        md.append("")
    md += ["## Settings", ""]
    md.append(f"- Nodes: `mink serve` subprocesses (benchmarks/latency_node.py), log level "
              f"{cfg['node_log_level']}, defaults otherwise: wal.max_delay "
              f"{report['wal_max_delay_ms']['file']:g} ms on file://, "
              f"{report['wal_max_delay_ms']['s3']:g} ms on s3://; WAL uploads in flight 1 on "
              "file://, 4 on s3://; wal_max_bytes 8 MiB.")
    md.append(f"- PostgreSQL: embedded (pgserver), fsync {'on' if cfg['postgres_durable'] else 'off'}"
              f"; one fresh database per node group. moto: {cfg['moto_mode']}. "
              f"Simulated network (s3+20ms): {cfg['simulated_latency_ms']:g} ms +- "
              f"{cfg['simulated_jitter_ms']:g} ms per object store request "
              "(LatencyObjectStore, in the node and in the baseline server).")
    md.append("")
    return "\n".join(md)


# -- plots -----------------------------------------------------------------------------------


def _cdf_axes(ax, title: str) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log")
    ax.set_yscale("logit")  # stretches both tails: p99 and p99.9 get as much room as p50
    ticks = [0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"p{100 * v:g}"))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:g}" if f"{v:g}"[0] in "235" else ""))
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("percentile (fraction of messages at or below)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)


def _plot_cdf(ax, cdf, label, **kwargs) -> None:
    points = [(ms, q / 100) for q, ms in cdf if 0 < q < 100 and ms and ms > 0]
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], label=label, **kwargs)


def plot(report: dict[str, Any], out_dir: Path, stamp: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    if report.get("latency"):
        fig, ax = plt.subplots(figsize=(9, 6))
        for r in report["latency"]:
            _plot_cdf(ax, r["latency"].get("cdf", []),
                      f"{r['store']}, {r['offered_mb_per_s']:g} MB/s (achieved "
                      f"{r['achieved_mb_per_s']:g})")
        target = report["wal_max_delay_ms"]["file"] + report["targets"]["latency_p99_extra_ms"]
        ax.axvline(target, color="red", linestyle=":", label=f"target p99 <= {target:g} ms "
                   f"(file://, {report['targets']['latency_rate_mb_s']:g} MB/s)")
        ax.axhline(0.99, color="grey", linestyle="--", linewidth=0.8)
        _cdf_axes(ax, "Produce latency (acks=all): delivery report - produce()")
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"kafka-{stamp}-produce-latency.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        names.append(name)
    if report.get("e2e"):
        fig, ax = plt.subplots(figsize=(9, 6))
        for r in report["e2e"]:
            _plot_cdf(ax, r["latency"].get("cdf", []), f"{r['store']} end-to-end")
            _plot_cdf(ax, r["produce"]["latency"].get("cdf", []),
                      f"{r['store']} produce (same messages)", linestyle="--")
        target = report["wal_max_delay_ms"]["file"] + report["targets"]["e2e_p99_extra_ms"]
        ax.axvline(target, color="red", linestyle=":", label=f"target p99 <= {target:g} ms")
        ax.axhline(0.99, color="grey", linestyle="--", linewidth=0.8)
        rate = report["e2e"][0]["rate_mb_s"]
        _cdf_axes(ax, f"End-to-end latency at {rate:g} MB/s: consumer receives - producer sends")
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"kafka-{stamp}-e2e-latency.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        names.append(name)
    bars: list[tuple[str, float, str]] = []
    for store, r in report.get("baseline", {}).items():
        bars.append((f"baseline {store}", r["mb_per_s"], "tab:grey"))
    for r in report.get("throughput", []):
        bars.append((f"produce {r['store']}, {r['partitions']}p", r["mb_per_s"], "tab:blue"))
    c = report.get("cluster", {}).get("throughput")
    if c:
        bars.append((f"produce 3 nodes, {c['partitions']}p", c["mb_per_s"], "tab:cyan"))
    for r in report.get("catchup", []):
        label = "catch-up " + r["store"] + (", page cache dropped" if r["page_cache_dropped"]
                                            else "")
        bars.append((label, r["mb_per_s"] or 0, "tab:green"))
    if bars:
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(bars) + 1.5))
        y = list(range(len(bars)))[::-1]
        ax.barh(y, [b[1] for b in bars], color=[b[2] for b in bars])
        ax.set_yticks(y, [b[0] for b in bars], fontsize=8)
        for yi, b in zip(y, bars):
            ax.text(b[1], yi, f" {b[1]:.0f}", va="center", fontsize=8)
        ax.axvline(report["targets"]["produce_mb_s"], color="tab:blue", linestyle=":",
                   label=f"produce target {report['targets']['produce_mb_s']:g} MB/s")
        ax.axvline(report["targets"]["catchup_mb_s"], color="tab:green", linestyle=":",
                   label=f"catch-up target {report['targets']['catchup_mb_s']:g} MB/s")
        ax.set_xlabel("MB/s (10^6 B of 1 KiB values; baseline: bytes into the store)")
        ax.set_title("Throughput")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        name = f"kafka-{stamp}-throughput.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


# -- files and console -----------------------------------------------------------------------


def write(out_dir: Path, stamp: str, report: dict[str, Any], plots: bool = True) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"kafka-{stamp}.json"
    md_path = out_dir / f"kafka-{stamp}.md"
    names: list[str] = []
    if plots:
        try:
            names = plot(report, out_dir, stamp)
        except ImportError as exc:
            report.setdefault("notes", []).append(f"no plots: {exc} (pip install matplotlib)")
    report["plots"] = names
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(markdown(report, json_path.name, names))
    return [json_path, md_path, *(out_dir / n for n in names)]


def console_summary(report: dict[str, Any]) -> str:
    parts = ["Targets:", text_table(*targets_table(report)).replace("**", "")]
    for title, table in (("Baseline:", baseline_table), ("Produce throughput:", throughput_table),
                         ("Produce latency:", latency_table), ("End-to-end:", e2e_table),
                         ("Catch-up:", catchup_table)):
        head, rows = table(report)
        if rows:
            parts += ["", title, text_table(head, rows)]
    bad = noisy(report)
    if bad:
        parts += ["", f"warning: other processes used {NOISY_OTHER_PCT:g}% of a core or more "
                      f"during {', '.join(bad)}"]
    if report.get("errors"):
        parts += ["", "Errors:"] + [f"  {e['scenario']}: {e['error']}" for e in report["errors"]]
    return "\n".join(parts)
