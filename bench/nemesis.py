#!/usr/bin/env python3
"""The long nemesis run: tests/test_nemesis.py's workload and checker for many minutes.

Five daemons with two copies of every shard on network-namespace hosts, four client
processes accumulating, writing and reading, and a seeded schedule of faults (kill -9
+ restart, SIGSTOP/SIGCONT, partition/heal, restart of every daemon; with
``--asymmetric`` also broken links between two daemons, the gap the README names).
At the end everything is healed and the checker judges the whole history
(docs/testing.md says what it proves). Prints the operations per kind and outcome,
the faults applied and every violation; exit status 1 if there is one. As root:

    python bench/nemesis.py --minutes 30 --seed 7 [--dir DIR] [--json]

The history (``history.jsonl``), the final copies and the daemons' logs stay in
``--dir`` (default: a new temporary directory, printed). A failing seed replays
the same faults: ``--seed N`` again, or ``IRDMA_NEMESIS_SEED=N`` for the short test.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.netns import netns_problem, remove_stale  # noqa: E402
from tests.nemesis.faults import ASYMMETRIC, SYMMETRIC  # noqa: E402
from tests.nemesis.run import RunConfig, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="of operations under faults")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--daemons", type=int, default=5)
    parser.add_argument("--think", type=float, default=0.02, help="longest pause between ops (s)")
    parser.add_argument(
        "--asymmetric", action="store_true", help="also break links between two daemons"
    )
    parser.add_argument(
        "--busy", type=int, default=0, help="processes spinning on the CPU while clients run"
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the run's files go")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    if (problem := netns_problem()) is not None:
        sys.exit(f"bench/nemesis.py: network namespaces unavailable: {problem}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="irdma-nemesis-"))
    kinds = (*SYMMETRIC, *ASYMMETRIC) if args.asymmetric else SYMMETRIC
    config = RunConfig(
        seed=seed,
        seconds=args.minutes * 60,
        daemons=args.daemons,
        clients=args.clients,
        kinds=kinds,
        think=args.think,
        busy=args.busy,
    )
    print(f"nemesis: seed {seed}, {args.minutes:g} min, files in {workdir}", flush=True)
    remove_stale()
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {line}", flush=True)

    result = run(config, workdir, log)
    report = result.report
    if args.json:
        summary = {
            "seed": seed,
            "minutes": args.minutes,
            "ops": {f: dict(c) for f, c in report.ops.items()},
            "faults": dict(report.faults),
            "violations": len(report.violations),
            "violation_kinds": sorted({v.kind for v in report.violations}),
            "observations": dict(report.observations),
            "history": str(result.history),
        }
        print(json.dumps(summary, indent=2))
    else:
        print(result.explain())
    print(f"took {time.monotonic() - started:.0f} s; history {result.history}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
