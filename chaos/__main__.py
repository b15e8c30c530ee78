"""`python -m chaos`: a fault campaign against a three-node Mink cluster.

    python -m chaos --duration 180 --faults mixed --seed 14
    python -m chaos --check chaos/results/<run>.history.jsonl     # re-check a history

Exit status: 0 no safety anomaly, 1 safety anomalies (named in the report), 2 the campaign
itself failed (the report says what it could).
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
from pathlib import Path

from chaos.checker import REPORTED, SAFETY, check, safety_failures
from chaos.history import read_history
from chaos.nemesis import FAULTS, GROUPS, parse_faults

RESULTS = Path(__file__).resolve().parent / "results"


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def check_and_report(history_path: Path, command: str) -> int:
    from chaos.report import write_report

    events = list(read_history(history_path))
    run = next((e for e in events if e["type"] == "run"), {})
    anomalies = check(events, stall_bound=run.get("stall_bound"))
    if run:  # the command that reproduces the run, also when only re-checking it
        command = (f"python -m chaos --duration {run['duration']:g} --faults "
                   f"{','.join(run['faults']) or 'none'} --seed {run['seed']} --rate {run['rate']:g}")
    paths = write_report(history_path, events, anomalies, command)
    failures = safety_failures(anomalies)
    counts = ", ".join(f"{name} {len(anomalies[name])}" for name in SAFETY + REPORTED)
    print(f"chaos: {'FAIL' if failures else 'PASS'}: {counts}")
    print(f"chaos: report {paths['md']}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=120.0,
                        help="seconds of workload under faults (default 120)")
    parser.add_argument("--faults", default="mixed",
                        help=f"comma list of {', '.join(FAULTS)} or groups {', '.join(GROUPS)}")
    parser.add_argument("--seed", type=int, help="the fault schedule's seed (printed; random if unset)")
    parser.add_argument("--rate", type=float, default=60.0, help="messages/s per producer")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument("--check", type=Path, metavar="HISTORY",
                        help="only check an existing history and write its report")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    command = "python -m chaos " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.check:
        return check_and_report(args.check, command)

    faults = parse_faults(args.faults)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    print(f"chaos: seed {seed} (reproduce with --seed {seed} --faults {args.faults} "
          f"--duration {args.duration:g})", flush=True)
    command = (f"python -m chaos --duration {args.duration:g} --faults {args.faults} "
               f"--seed {seed} --rate {args.rate:g}")
    # SIGINT explicitly too: a shell starting us in the background leaves it ignored
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)

    from chaos.campaign import Campaign

    campaign = Campaign(seed=seed, duration=args.duration, faults=faults, out_dir=args.out,
                        rate=args.rate, keep_work_dir=args.keep_work_dir)
    history_path = campaign.history.path
    try:
        campaign.run()
    except KeyboardInterrupt:
        print("chaos: interrupted; stopping everything", file=sys.stderr)
        campaign.close()
        return 130
    except Exception:
        logging.exception("the campaign failed")
        campaign.close()
        print(f"chaos: logs in {campaign.out_dir / (campaign.name + '.logs')}", file=sys.stderr)
        try:
            check_and_report(history_path, command)
        except Exception:
            logging.exception("no report")
        return 2
    campaign.close()
    return check_and_report(history_path, command)


if __name__ == "__main__":
    sys.exit(main())
