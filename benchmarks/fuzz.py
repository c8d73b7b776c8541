"""The fuzz suite's long run: mutated real logs through every reader (issue 14).

Each case is a few lines of a real log in ../shared/data (TopHub AutoTVM logs as layouts 0.2
and 0.1, auto-scheduler logs, MetaSchedule database pairs) changed by one to four random
mutations, then read by every reader and checked by ``check_log`` of the fuzz harness
(``tests/fuzzing.py``); every ``--store-every``-th case is also ingested (plain and
``--strict``) into a fresh store, every ``--parallel-every``-th read by worker processes too. Unlike the pytest properties
(tests/test_formats_fuzz.py), which stop at the first failing case, this counts them.

    python benchmarks/fuzz.py              # 10,000 cases
    python benchmarks/fuzz.py --quick      # 1,000 cases
    python benchmarks/fuzz.py --cases 50000 --seed 7

Last line: ``fuzz_cases= fuzz_crashes= fuzz_disagreements=`` (goal: 0 and 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from fuzzing import run_fuzz  # noqa: E402  (tests/fuzzing.py, the fuzz suite's harness)

DEFAULT_DATA = REPO.parent / "shared" / "data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 cases")
    parser.add_argument("--cases", type=int, help="number of cases (default 10,000; 1,000 with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the cases (default 0)")
    parser.add_argument("--store-every", type=int, default=10, help="ingest every N-th case (default 10)")
    parser.add_argument("--parallel-every", type=int, default=50,
                        help="read every N-th AutoTVM case with worker processes too (default 50; 0: never)")
    parser.add_argument("--data", default=os.environ.get("LORIEN_SHARED_DATA", str(DEFAULT_DATA)),
                        help="the shared logs (default ../shared/data or $LORIEN_SHARED_DATA)")
    args = parser.parse_args(argv)
    cases = args.cases or (1000 if args.quick else 10_000)
    shown: set[tuple[str, str]] = set()

    def on_case(number, case, findings) -> None:
        for finding in findings:
            key = (finding.kind, finding.where)
            if key not in shown:  # each kind of finding once, with the case that showed it
                shown.add(key)
                print(f"case {number} ({case.describe()}):\n  {finding}", flush=True)

    started = time.perf_counter()
    report = run_fuzz(args.data, cases, seed=args.seed, store_every=args.store_every,
                      parallel_every=args.parallel_every, on_case=on_case)
    seconds = time.perf_counter() - started
    print(f"fuzz: {report.cases} cases (seed {args.seed}) in {seconds:.1f} s ({report.cases / seconds:.0f} cases/s), "
          f"{len(report.failures)} failing; every {args.store_every}th ingested, "
          f"every {args.parallel_every}th read by worker processes")
    print(f"fuzz_cases={report.cases} fuzz_crashes={report.crashes} fuzz_disagreements={report.disagreements}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
