"""Benchmark: CPU seconds per GiB that ckptfs and the S3 server spend to save, upload and
fetch a torch checkpoint.

For each target (interleaved, medians of --runs), the same state dict as scripts/bench.py
(an optimizer checkpoint of 16 MiB fp32 tensors, 64 per GiB) is:

  save    torch.save into step-1/ of a new mount (fresh cache), right after it is up;
          this includes the uploads that run beside the save (--uploads-while-writing)
  upload  from the end of torch.save until `ckptfs sync` returns: everything durable
  fetch   the page cache dropped, a new mount on an empty cache, then torch.load of the
          file; counted from the moment the mount is up (its start-up is not per GiB)

and for each phase the CPU time (user + system, /proc/PID/stat) of the ckptfs daemon
and of the SeaweedFS process (`weed server`: master, volume, filer and S3 gateway in
one) is divided by the checkpoint's size in GiB. The wall time of each phase is shown
beside it. Run as root (the page cache is dropped before each fetch).

Targets:
  ck-s3   ckptfs on SeaweedFS S3 (started here on 127.0.0.1)
  ck-dir  ckptfs on the local-directory store (no server: weed's column shows its idle)
A target may name another source tree after '@' (a checkout of an older commit, for
before/after in one invocation) and carry mount options after a colon, as in bench.py:

    git archive HEAD~1 | (mkdir /tmp/before && tar -x -C /tmp/before)
    .venv/bin/python scripts/bench_cpu.py --runs 3 \\
        --targets 'ck-s3@/tmp/before,ck-s3,ck-dir@/tmp/before,ck-dir'
    .venv/bin/python scripts/bench_cpu.py --targets 'ck-s3:--uploads-while-writing=0'

--profile DIR records each phase of the first run of every target with py-spy
(`--format raw`, with --threads) into DIR/<target>-<phase>.txt; the CPU of a profiled
run includes py-spy's sampling and is left out of the medians.

--gil samples the daemon with `py-spy record --gil --rate 100` over each phase of
every run and adds the seconds it held the GIL per GiB (samples / rate / GiB): the time
in which no other thread of it (the FUSE loop) could run Python; in parentheses, the
part held by threads other than the main one (the data path: the fetch and upload
threads). py-spy pauses the daemon for each sample, so with --gil the CPU and wall
times include its sampling.
--flamegraphs DIR adds a first run, left out of the medians, whose phases py-spy records
the same way as flame graphs of the GIL holders, DIR/gil-<target>-<phase>.svg; with
--gil, DIR also keeps the last run's samples (DIR/gil-<target>-<phase>.txt, raw form).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = ("save", "upload", "fetch")
TICK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """A failure reported as one line."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError as e:
        raise BenchError(f"cannot read the CPU time of pid {pid}: {e.strerror}") from None
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def ckptfs(*args: str, tree: str | None) -> str:
    """Run the ckptfs command line from source tree `tree` (None: this one)."""
    env = {**os.environ, "PYTHONPATH": tree or str(Path(__file__).resolve().parent.parent)}
    r = subprocess.run([sys.executable, "-m", "ckptfs.cli", *args], capture_output=True,
                       text=True, env=env, cwd=tree)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise BenchError(f"ckptfs {args[0]} failed: {last}")
    return r.stdout


def daemon_pid(mnt: Path, tree: str | None) -> int:
    return int(json.loads(ckptfs("status", str(mnt), "--json", tree=tree))["pid"])


class Meter:
    """CPU seconds of the daemon and of weed between two marks, and the wall time."""

    def __init__(self, daemon: int, weed: int | None) -> None:
        self.daemon, self.weed = daemon, weed
        self.mark()

    def _now(self) -> tuple[float, float, float]:
        weed = cpu_seconds(self.weed) if self.weed else 0.0
        return time.perf_counter(), cpu_seconds(self.daemon), weed

    def mark(self) -> None:
        self.start = self._now()

    def take(self) -> dict[str, float]:
        end = self._now()
        wall, daemon, weed = (b - a for a, b in zip(self.start, end, strict=True))
        self.start = end
        return {"wall": wall, "daemon": daemon, "weed": weed}


#: py-spy's samples per second (--gil counts samples at this rate)
RATE = 100


class Profiler:
    """py-spy on one pid until stop() (or a no-op without a directory): its threads'
    stacks (`--profile`), or only the GIL holder's (`gil`, in raw or flamegraph form)."""

    def __init__(self, out: Path | None, name: str, pid: int, gil: str | None = None
                 ) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if out is None:
            return
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if gil is None:
            how = ["--threads", "--format", "raw"]
            self.path = out / f"{name}.txt"
        else:
            how = ["--gil", "--format", gil]
            self.path = out / f"gil-{name}.{'svg' if gil == 'flamegraph' else 'txt'}"
        self.proc = subprocess.Popen(
            [spy, "record", "--pid", str(pid), "--rate", str(RATE), *how,
             "-o", str(self.path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # attached

    def stop(self) -> dict[str, float]:
        """Stop sampling; the seconds of samples recorded (raw form; else 0), all of
        them ("gil") and those of threads other than the main one ("gil-threads": the
        data path's, beside the FUSE loop)."""
        if self.proc is None:
            return {"gil": 0.0, "gil-threads": 0.0}
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        if self.path.suffix != ".txt":
            return {"gil": 0.0, "gil-threads": 0.0}
        try:
            lines = self.path.read_text().splitlines()
        except OSError as e:
            raise BenchError(f"py-spy wrote no {self.path.name}: {e.strerror}") from None
        samples = [(stack, int(n)) for stack, _, n in (line.rpartition(" ") for line in lines)
                   if stack]
        return {"gil": sum(n for _, n in samples) / RATE,
                "gil-threads": sum(n for stack, n in samples
                                   if stack.startswith("Thread._bootstrap")) / RATE}


def run_target(work: Path, state: dict[str, object], store: str, extra: list[str],
               weed: int | None, tree: str | None, profile: Path | None, name: str,
               gil: str | None = None) -> dict[str, dict[str, float]]:
    """One save, upload and fetch of `state` on `store`: {phase: {wall, daemon, weed,
    gil}}, py-spy recording into `profile` as Profiler's `gil` says (gil 0 unless raw)."""
    import torch  # (here, as bench.py, which imports it: --help stays instant)
    from benchlib.harness import drop_caches

    mnt, mnt2 = work / "mnt", work / "mnt2"
    cache, cache2 = work / "cache", work / "cache2"
    for p in (cache, cache2):
        shutil.rmtree(p, ignore_errors=True)
    mnt.mkdir(exist_ok=True)
    mnt2.mkdir(exist_ok=True)
    out: dict[str, dict[str, float]] = {}
    drop_caches()
    time.sleep(1)
    ckptfs("mount", store, str(mnt), "--cache-dir", str(cache), *extra, tree=tree)
    try:
        pid = daemon_pid(mnt, tree)
        spy = Profiler(profile, f"{name}-save", pid, gil)
        meter = Meter(pid, weed)
        (mnt / "step-1").mkdir()
        torch.save(state, mnt / "step-1" / "ckpt.pt")
        out["save"] = meter.take()
        out["save"].update(spy.stop())
        spy = Profiler(profile, f"{name}-upload", pid, gil)
        meter.mark()
        ckptfs("sync", str(mnt), tree=tree)
        out["upload"] = meter.take()
        out["upload"].update(spy.stop())
        size = (mnt / "step-1" / "ckpt.pt").stat().st_size
    finally:
        ckptfs("umount", str(mnt), tree=tree)
    drop_caches()
    ckptfs("mount", store, str(mnt2), "--cache-dir", str(cache2), *extra, tree=tree)
    try:
        pid = daemon_pid(mnt2, tree)
        spy = Profiler(profile, f"{name}-fetch", pid, gil)
        meter = Meter(pid, weed)
        torch.load(mnt2 / "step-1" / "ckpt.pt")
        out["fetch"] = meter.take()
        out["fetch"].update(spy.stop())
        shutil.rmtree(mnt2 / "step-1")
    finally:
        ckptfs("umount", str(mnt2), tree=tree)
    for p in (cache, cache2):
        shutil.rmtree(p, ignore_errors=True)
    gib = size / 2**30
    for phase in out.values():
        for key in ("daemon", "weed", "gil", "gil-threads"):
            phase[key] /= gib
    return out


def parse_targets(spec: str) -> list[tuple[str, str, str | None, list[str]]]:
    """(label, kind, tree, mount options) of each comma-separated target."""
    targets = []
    for t in spec.split(","):
        head, _, options = t.partition(":")
        kind, _, tree = head.partition("@")
        if kind not in ("ck-s3", "ck-dir"):
            raise BenchError(f"unknown target {t!r} (ck-s3 or ck-dir, with @TREE and "
                             f":OPTIONS as in bench.py)")
        if tree and not (Path(tree) / "ckptfs" / "__init__.py").is_file():
            raise BenchError(f"{tree} is not a ckptfs source tree (no ckptfs/__init__.py)")
        targets.append((t, kind, tree or None, options.split()))
    return targets


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] + " " + __doc__.splitlines()[1],
        epilog="\n".join(__doc__.splitlines()[3:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="checkpoint size (default 1)")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs (default 3)")
    ap.add_argument("--targets", default="ck-s3,ck-dir",
                    help="comma-separated: ck-s3, ck-dir, each with @TREE and :OPTIONS "
                         "(default: ck-s3,ck-dir)")
    ap.add_argument("--workdir", default=None, help="where caches and the stores go "
                                                    "(default: /tmp)")
    ap.add_argument("--profile", type=Path, metavar="DIR",
                    help="py-spy raw profiles of each phase of the first run, into DIR")
    ap.add_argument("--gil", action="store_true",
                    help="also the seconds per GiB the daemon holds the GIL (py-spy --gil)")
    ap.add_argument("--flamegraphs", type=Path, metavar="DIR",
                    help="a first run recording flame graphs of the GIL holders into DIR")
    a = ap.parse_args()
    if a.runs < 1 or a.gib <= 0:
        ap.error("--runs must be at least 1 and --gib above 0")
    try:
        targets = parse_targets(a.targets)
    except BenchError as e:
        ap.error(str(e))
    if a.profile is not None and a.flamegraphs is not None:
        ap.error("--profile and --flamegraphs each add a first run: give one of them")
    for d in (a.profile, a.flamegraphs):
        if d is not None:
            d.mkdir(parents=True, exist_ok=True)
    try:
        return bench(a, targets)
    except BenchError as e:
        print(f"bench_cpu.py: error: {e}", file=sys.stderr)
        return 1
    except (OSError, RuntimeError) as e:
        print(f"bench_cpu.py: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1


def bench(a: argparse.Namespace, targets: list[tuple[str, str, str | None, list[str]]]
          ) -> int:
    from benchlib.harness import state_dict
    from seaweed import SeaweedServer

    work = Path(tempfile.mkdtemp(prefix="ckptfs-cpu-", dir=a.workdir))
    state = state_dict(a.gib)
    server = SeaweedServer(work / "weed")
    os.environ.update(AWS_ACCESS_KEY_ID=server.access_key,
                      AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION="us-east-1")
    results: dict[str, list[dict[str, dict[str, float]]]] = {t[0]: [] for t in targets}
    try:
        server.start()
        assert server.proc is not None
        weed = server.proc.pid
        bucket = server.new_bucket()
        first = a.profile or a.flamegraphs
        for i in range(a.runs + (first is not None)):
            profile, gil = (first, "flamegraph" if a.flamegraphs else None) if (
                first is not None and i == 0) else (
                (a.flamegraphs or work / "gil") if a.gil else None, "raw")
            if profile is not None:
                profile.mkdir(exist_ok=True)
            for n, (label, kind, tree, extra) in enumerate(targets):
                if kind == "ck-s3":
                    store = f"s3://{bucket}/run{i}-{n}"
                    extra = ["--endpoint-url", server.endpoint, *extra]
                else:
                    store = str(work / f"dir-store-{n}")
                    shutil.rmtree(store, ignore_errors=True)
                    os.mkdir(store)
                name = label.replace("/", "_").replace(":", "_").replace("@", "_")
                r = run_target(work, state, store, extra, weed, tree, profile, name, gil)
                if kind == "ck-dir":
                    shutil.rmtree(store, ignore_errors=True)
                profiled = first is not None and i == 0
                if not profiled:
                    results[label].append(r)
                print(f"run {i + 1}{' (profiled)' if profiled else ''} {label}: " + "  ".join(
                    f"{p} {r[p]['wall']:.2f}s ckptfs {r[p]['daemon']:.2f}"
                    + (f" gil {r[p]['gil']:.2f} ({r[p]['gil-threads']:.2f})"
                       if a.gil and not profiled else "")
                    + f" weed {r[p]['weed']:.2f}" for p in PHASES), flush=True)
    finally:
        server.stop()
        for m in ("mnt", "mnt2"):
            if os.path.ismount(work / m):
                subprocess.run(["fusermount3", "-u", "-z", str(work / m)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    report(a, targets, results)
    return 0


def report(a: argparse.Namespace, targets: list[tuple[str, str, str | None, list[str]]],
           results: dict[str, list[dict[str, dict[str, float]]]]) -> None:
    def med(label: str, phase: str, key: str) -> float:
        return statistics.median(r[phase][key] for r in results[label])

    def total(label: str, key: str, phases: tuple[str, ...]) -> float:
        return statistics.median(sum(r[p][key] for p in phases) for r in results[label])

    width = max(len("target"), *(len(t[0]) for t in targets))
    print(f"\n{a.gib:g} GiB checkpoint, CPU seconds per GiB (user+sys), medians of "
          f"{a.runs} interleaved runs; wall seconds in ()")
    head = "".join(f"  {p + ' ckptfs':>14s} {p + ' weed':>12s}" for p in PHASES)
    print(f"{'target':{width}s}{head}  {'save+upload ckptfs':>18s} {'weed':>6s}")
    for label, *_ in targets:
        row = "".join(f"  {med(label, p, 'daemon'):6.2f} ({med(label, p, 'wall'):5.2f}) "
                      f"{med(label, p, 'weed'):12.2f}" for p in PHASES)
        print(f"{label:{width}s}{row}  {total(label, 'daemon', ('save', 'upload')):18.2f} "
              f"{total(label, 'weed', ('save', 'upload')):6.2f}")
    if a.gil:
        print(f"\nseconds the daemon held the GIL per GiB (py-spy --gil, {RATE} Hz), "
              f"medians; in (): its threads other than the main one (the FUSE loop's)")
        print(f"{'target':{width}s}" + "".join(f"  {p:>13s}" for p in PHASES)
              + f"  {'save+upload':>13s}")
        for label, *_ in targets:
            print(f"{label:{width}s}" + "".join(
                f"  {med(label, p, 'gil'):6.2f} ({med(label, p, 'gil-threads'):4.2f})"
                for p in PHASES) + f"  {total(label, 'gil', ('save', 'upload')):6.2f} "
                f"({total(label, 'gil-threads', ('save', 'upload')):4.2f})")


if __name__ == "__main__":
    sys.exit(main())
