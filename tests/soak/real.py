"""The soak's real-process level: 2 FUSE mounts on SeaweedFS behind the fault proxy, kill -9."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import NoReturn

import soaklib
from faultproxy import FaultProxy, never
from mounting import Mount, become_subreaper, is_mounted, lazy_unmount, run_cli
from seaweed import SeaweedServer

#: the kinds the real level runs (the others need the core tier's hooks)
KINDS = ("save", "save_torch", "append", "pwrite", "truncate", "read", "read_other",
         "rename", "unlink", "mkdir", "rmdir", "sync", "crash", "store_faults", "outage",
         "heal")
NODES = 2


def throttled(method: str, path: str) -> bool:
    return True


class RealSoak:
    """A SeaweedFS server and a fault proxy for any number of schedules."""

    def __init__(self, workdir: Path, seaweed: SeaweedServer | None = None,
                 proxy: FaultProxy | None = None) -> None:
        self.workdir = workdir
        self.own = seaweed is None
        self.seaweed = seaweed
        self.proxy = proxy
        self.env: dict[str, str] | None = None

    def _start(self) -> None:
        become_subreaper()  # the daemons are our children: kill -9 is checked by its code
        if self.seaweed is None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.seaweed = SeaweedServer(self.workdir / "seaweed")
            self.seaweed.start()
            self.env = dict(os.environ, AWS_ACCESS_KEY_ID=self.seaweed.access_key,
                            AWS_SECRET_ACCESS_KEY=self.seaweed.secret_key,
                            AWS_DEFAULT_REGION="us-east-1")
            os.environ.update(self.env)
        if self.proxy is None:
            self.proxy = FaultProxy(self.seaweed.endpoint)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        if self.own and self.seaweed is not None:
            self.seaweed.stop()

    def run(self, seed: int, n_ops: int, work: Path) -> soaklib.Result:
        self._start()
        assert self.seaweed is not None and self.proxy is not None
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        bucket = self.seaweed.new_bucket()
        run = RealRun(seed, n_ops, work, f"s3://{bucket}/soak", self.proxy)
        try:
            run.run()
        finally:
            run.cleanup()
            with contextlib.suppress(Exception):
                self.seaweed.drop_bucket(bucket)
        if run.result.failure is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            run.result.failure += "\n  trace:\n" + "\n".join(
                "    " + t for t in run.trace[-40:])
        return run.result


class RealRun:
    """One schedule on real mounts. The model: path -> bytes or DIR, each file as of its
    last close (acknowledged), which must survive kill -9 and the remount."""

    def __init__(self, seed: int, n_ops: int, work: Path, url: str, proxy: FaultProxy
                 ) -> None:
        self.seed = seed
        self.work = work
        self.url = url
        self.proxy = proxy
        self.rnd = random.Random(seed)
        ops = [op for op in soaklib.generate(seed, n_ops * 4, NODES) if op.kind in KINDS]
        self.ops = ops[:n_ops]
        self.result = soaklib.Result(seed, len(self.ops))
        self.tree: dict[str, bytes | soaklib.Dir] = {}
        self.ever: dict[str, set[str]] = {}
        self.trace: list[str] = []
        self.extra = ["--endpoint-url", proxy.endpoint, "--chunk-size", "64K",
                      "--metadata-ttl", "0.2", "--missing-chunk-timeout", "5"]
        self.mounts = [Mount(url, work, f"n{k}", extra=self.extra) for k in range(NODES)]

    def cleanup(self) -> None:
        self.proxy.throttle(0.0, never)
        for m in self.mounts:
            m.cleanup()

    def fail(self, what: str) -> NoReturn:
        raise soaklib.SoakFailure(what)

    def files(self, k: int) -> list[str]:
        return sorted(p for p, v in self.tree.items()
                      if p.startswith(f"n{k}/") and isinstance(v, bytes))

    def dirs(self, k: int) -> list[str]:
        return [f"n{k}"] + sorted(p for p, v in self.tree.items()
                                  if p.startswith(f"n{k}/") and isinstance(v, soaklib.Dir))

    def note(self, path: str) -> None:
        v = self.tree.get(path)
        if isinstance(v, bytes):
            self.ever.setdefault(path, set()).add(soaklib.digest(v))

    def run(self) -> None:
        started = time.monotonic()
        try:
            for m in self.mounts:
                m.mount()
            os.mkdir(self.mounts[0] / "n0")
            os.mkdir(self.mounts[1] / "n1")
            self.tree["n0"] = self.tree["n1"] = soaklib.DIR
            for i, op in enumerate(self.ops):
                self.trace.append(f"{i} {op}")
                self.result.kinds[op.kind] += 1
                if op.kind in soaklib.FAULT_KINDS:
                    self.result.faults[op.kind] += 1
                getattr(self, f"op_{op.kind}")(op)
                self.result.done = i + 1
            self.final_check()
        except soaklib.SoakFailure as e:
            self.result.failure = f"at op {self.result.done}: {e}"
        except Exception as e:  # noqa: BLE001 - a failure of the seed, reported
            self.result.failure = f"at op {self.result.done}: {type(e).__name__}: {e}"
        self.result.seconds = time.monotonic() - started

    # ------------------------------------------------------------ file calls
    def mnt(self, k: int) -> Mount:
        return self.mounts[k]

    def op_save(self, op: soaklib.Op, torch: bool = False) -> None:
        k = op.node
        files = self.files(k)
        if op.b % 2 and files:
            path = files[op.a % len(files)]
        else:
            dirs = self.dirs(k)
            path = f"{dirs[op.a % len(dirs)]}/f{op.b % 8}"
            if isinstance(self.tree.get(path), soaklib.Dir):
                return
        data = soaklib.content(self.seed, op.c, torch_shaped=torch)
        (self.mnt(k) / path).write_bytes(data)
        if op.c % 5 == 0:
            with open(self.mnt(k) / path, "rb+") as f:
                os.fsync(f.fileno())
        self.tree[path] = data
        self.note(path)

    def op_save_torch(self, op: soaklib.Op) -> None:
        self.op_save(op, torch=True)

    def modify(self, op: soaklib.Op, change: str) -> None:
        k = op.node
        files = self.files(k)
        if not files:
            return
        path = files[op.a % len(files)]
        old = self.tree[path]
        assert isinstance(old, bytes)
        p = self.mnt(k) / path
        if change == "append":
            data = soaklib.content(self.seed, op.c)[:70000]
            with open(p, "ab") as f:
                f.write(data)
            new = old + data
        elif change == "pwrite":
            data = random.Random(op.c).randbytes(op.c % 5000 + 1)
            off = op.b % (len(old) + 1)
            with open(p, "r+b") as f:
                f.seek(off)
                f.write(data)
            buf = bytearray(old)
            buf.extend(b"\0" * max(0, off + len(data) - len(buf)))
            buf[off:off + len(data)] = data
            new = bytes(buf)
        else:
            size = op.b % (len(old) + 65537)
            os.truncate(p, size)
            new = old[:size] + b"\0" * max(0, size - len(old))
        self.tree[path] = new
        self.note(path)

    def op_append(self, op: soaklib.Op) -> None:
        self.modify(op, "append")

    def op_pwrite(self, op: soaklib.Op) -> None:
        self.modify(op, "pwrite")

    def op_truncate(self, op: soaklib.Op) -> None:
        self.modify(op, "truncate")

    def op_read(self, op: soaklib.Op) -> None:
        k = op.node
        files = self.files(k)
        if not files:
            return
        path = files[op.a % len(files)]
        try:
            got = (self.mnt(k) / path).read_bytes()
        except OSError as e:
            if self.proxy.p > 0:
                return  # EIO while the store fails a fetch: allowed
            self.fail(f"read {path} on its writer n{k}: {e}")
        if got != self.tree[path]:
            self.fail(f"read {path} on n{k}: {soaklib._show(got)}, acknowledged "
                      f"{soaklib._show(self.tree[path])}")

    def op_read_other(self, op: soaklib.Op) -> None:
        k = op.node
        files = self.files(1 - k)
        if not files:
            return
        path = files[op.a % len(files)]
        try:
            got = (self.mnt(k) / path).read_bytes()
        except OSError:
            return  # not visible there yet, or its chunks not uploaded yet
        if soaklib.digest(got) not in set().union(*self.ever.values()):
            self.fail(f"n{k} read {path}: {soaklib._show(got)}, never written")

    def op_rename(self, op: soaklib.Op) -> None:
        k = op.node
        files = self.files(k)
        if not files:
            return
        src = files[op.a % len(files)]
        if op.b % 2:
            dst = files[op.b % len(files)]
        else:
            dirs = self.dirs(k)
            dst = f"{dirs[op.b % len(dirs)]}/f{op.c % 8}"
        if dst == src or isinstance(self.tree.get(dst), soaklib.Dir):
            return
        os.rename(self.mnt(k) / src, self.mnt(k) / dst)
        self.tree[dst] = self.tree.pop(src)
        self.note(dst)

    def op_unlink(self, op: soaklib.Op) -> None:
        k = op.node
        files = self.files(k)
        if not files:
            return
        path = files[op.a % len(files)]
        os.unlink(self.mnt(k) / path)
        del self.tree[path]

    def op_mkdir(self, op: soaklib.Op) -> None:
        k = op.node
        dirs = self.dirs(k)
        parent = dirs[op.a % len(dirs)]
        path = f"{parent}/d{op.b % 4}"
        if path in self.tree or parent.count("/") >= 2:
            return
        os.mkdir(self.mnt(k) / path)
        self.tree[path] = soaklib.DIR

    def op_rmdir(self, op: soaklib.Op) -> None:
        k = op.node
        dirs = self.dirs(k)[1:]
        if not dirs:
            return
        path = dirs[op.a % len(dirs)]
        if any(p.startswith(path + "/") for p in self.tree):
            return
        os.rmdir(self.mnt(k) / path)
        del self.tree[path]

    def op_sync(self, op: soaklib.Op) -> None:
        self.proxy.throttle(0.0, never)
        self.mnt(op.node).sync()

    def op_crash(self, op: soaklib.Op) -> None:
        """kill -9 of the daemon, then a remount on the same cache directory."""
        m = self.mnt(op.node)
        m.kill()
        self.trace.append(f"    * n{op.node} killed")
        m.mount()

    def op_store_faults(self, op: soaklib.Op) -> None:
        self.proxy.throttle(0.05 + (op.a % 10) / 100.0, throttled)
        self.result.faults["store: 503 SlowDown"] += 1

    def op_outage(self, op: soaklib.Op) -> None:
        self.proxy.throttle(1.0, throttled)
        time.sleep(0.2 + (op.a % 5) / 10.0)
        self.proxy.throttle(0.0, never)

    def op_heal(self, op: soaklib.Op) -> None:
        self.proxy.throttle(0.0, never)

    # ------------------------------------------------------------ the check
    def final_check(self) -> None:
        self.proxy.throttle(0.0, never)
        for m in self.mounts:
            m.umount()
        fresh = Mount(self.url, self.work, "fresh", extra=self.extra)
        self.mounts.append(fresh)
        fresh.mount()
        seen: dict[str, bytes | soaklib.Dir] = {}
        for top in ("n0", "n1"):
            for dirpath, _dirnames, filenames in os.walk(fresh / top):
                rel = os.path.relpath(dirpath, fresh.path)
                seen[rel] = soaklib.DIR
                for name in filenames:
                    seen[f"{rel}/{name}"] = Path(dirpath, name).read_bytes()
        for p in sorted(set(seen) | set(self.tree)):
            if not soaklib._same(seen.get(p), self.tree.get(p)):
                self.fail(f"a fresh mount shows {p} as {soaklib._show(seen.get(p))}, "
                          f"acknowledged {soaklib._show(self.tree.get(p))}")
        fresh.umount()
        r = run_cli("fsck", self.url, "--deep", "--json", "--endpoint-url",
                    self.proxy.endpoint, check=False)
        report = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
        if r.returncode != 0 or report.get("problems"):
            self.fail(f"fsck --deep: exit {r.returncode}: {r.stdout[-800:]} {r.stderr[-400:]}")
        assert not any(is_mounted(m.path) for m in self.mounts)


def lazy_cleanup(paths: list[Path]) -> None:
    for p in paths:
        lazy_unmount(p)


_ = Counter  # (kept for the summary's types)
