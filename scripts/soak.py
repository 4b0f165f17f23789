"""Long soaks of the seeded fault harness (docs/SOAK.md): scripts/soak.py --seeds A..B --ops N."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "soak"), str(ROOT / "tests")]

import soaklib  # noqa: E402


def seed_range(text: str) -> range:
    a, _, b = text.partition("..")
    return range(int(a), int(b or a) + 1)


def bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", required=True, help="A..B (both included) or one seed")
    ap.add_argument("--ops", type=int, default=300, help="operations per schedule")
    ap.add_argument("--workdir", default=os.environ.get("TMPDIR", "/tmp") + "/ckptfs-soak")
    ap.add_argument("--family", default="mixed", choices=sorted(soaklib.FAMILIES),
                    help="the schedule family (docs/SOAK.md; default mixed)")
    ap.add_argument("--shrink", action="store_true", help="shrink each failing seed")
    ap.add_argument("--real", action="store_true",
                    help="drive real FUSE mounts on SeaweedFS instead (tests/soak/real.py)")
    ap.add_argument("--json", help="write the summary here as JSON")
    ap.add_argument("--jobs", type=int, default=1,
                    help="schedules run at once, each in a process of its own (a schedule "
                         "mostly waits, so 3 on 2 cores keeps them busy; core level only)")
    args = ap.parse_args()
    if args.jobs < 1 or (args.real and args.jobs != 1):
        ap.error("--jobs takes a number from 1 on, and 1 with --real")
    logging.disable(logging.CRITICAL)
    seeds = seed_range(args.seeds)
    tty = sys.stderr.isatty()
    started = time.monotonic()
    faults: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    failures: list[dict[str, object]] = []
    totals = [0, 0]  # schedules, ops
    runner: object = None
    if args.real:
        import real  # the real-process level
        runner = real.RealSoak(Path(args.workdir))
    try:
        run_all(args, seeds, tty, started, faults, kinds, failures, totals, runner)
    except KeyboardInterrupt:
        print("\ninterrupted: the summary covers the schedules done", file=sys.stderr)
    schedules, ops_done = totals
    summarize(args, schedules, ops_done, started, faults, kinds, failures)
    return 1 if failures else 0


def results(args: argparse.Namespace, seeds: range, runner: object
            ) -> Iterator[tuple[int, soaklib.Result]]:
    """(seed, result) of each schedule, in the order they finish."""
    if args.real:
        for seed in seeds:
            yield seed, runner.run(seed, args.ops, Path(args.workdir) / f"seed{seed}")  # type: ignore[attr-defined]
        return
    if args.jobs == 1:
        for seed in seeds:
            yield seed, soaklib.run_one(seed, args.ops, Path(args.workdir) / f"seed{seed}",
                                        family=args.family)
        return
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        running = {pool.submit(soaklib.run_one, seed, args.ops,
                               Path(args.workdir) / f"seed{seed}", family=args.family): seed
                   for seed in seeds}
        try:
            for done in concurrent.futures.as_completed(running):
                yield running[done], done.result()
        finally:
            for future in running:
                future.cancel()


def run_all(args: argparse.Namespace, seeds: range, tty: bool, started: float,
            faults: Counter[str], kinds: Counter[str], failures: list[dict[str, object]],
            totals: list[int], runner: object) -> None:
    for i, (seed, result) in enumerate(results(args, seeds, runner)):
        totals[0] += 1
        totals[1] += result.done
        ops_done = totals[1]
        faults.update(result.faults)
        kinds.update(result.kinds)
        if result.failure is not None:
            entry: dict[str, object] = {"seed": seed, "ops": args.ops,
                                        "failure": result.failure.split("\n")[0]}
            print(f"FAIL seed {seed}: {result.failure}", file=sys.stderr, flush=True)
            if args.shrink and not args.real:
                ops = soaklib.generate(seed, args.ops, family=args.family)[:result.done + 1]
                short = soaklib.shrink(seed, ops, Path(args.workdir) / "shrink")
                entry["shrunk"] = [str(op) for op in short]
                print("  shrunk to:\n" + soaklib.render(short), file=sys.stderr, flush=True)
            failures.append(entry)
        elapsed = time.monotonic() - started
        line = (f"{bar(i + 1, len(seeds))} {i + 1}/{len(seeds)} seed {seed} "
                f"{result.done} ops {result.seconds:.1f}s  total {ops_done} ops "
                f"{len(failures)} failed  {elapsed:.0f}s")
        if tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)
        if args.json:
            summarize(args, totals[0], ops_done, started, faults, kinds, failures,
                      quiet=True)
    if tty:
        print(file=sys.stderr)


def summarize(args: argparse.Namespace, schedules: int, ops_done: int, started: float,
              faults: Counter[str], kinds: Counter[str], failures: list[dict[str, object]],
              quiet: bool = False) -> None:
    summary = {"seeds": args.seeds, "family": args.family, "ops_per_schedule": args.ops,
               "schedules": schedules,
               "ops": ops_done, "seconds": round(time.monotonic() - started, 1),
               "faults": dict(sorted(faults.items())), "ops_by_kind": dict(sorted(kinds.items())),
               "failures": failures}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if quiet:
        return
    print(f"schedules {schedules}, ops {ops_done}, failures {len(failures)}, "
          f"{summary['seconds']} s")
    print("faults by kind:")
    for k, v in sorted(faults.items()):
        print(f"  {k:28s} {v}")
    for f in failures:
        print(f"  FAILED seed {f['seed']}: {f['failure']}")


if __name__ == "__main__":
    sys.exit(main())
