"""The mount's auto-prune task (autoprune.AutoPruner): when a prune runs after this mount
writes into checkpoint directories (quiet delay, one per directory, after the uploads
drain, again while the newest checkpoint is incomplete, errors), on a virtual clock with a
stand-in prune; then the real prune over a CheckpointFS on a LocalStore: what it removes,
what it keeps while this mount still writes there, and the mount's view after it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing
from corefs import core, run, write_file
from support import random_bytes, wait_until_async

from ckptfs.common.errors import NoEntry, TransientStoreError
from ckptfs.format import manifests
from ckptfs.fs.autoprune import AutoPruner, Policy
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.namespace import DirNode
from ckptfs.pipeline.journal import Op
from ckptfs.store.local import LocalStore
from ckptfs.tools import retention
from ckptfs.tools.retention import Checkpoint, PruneResult

POLICY = Policy(2, None, "checkpoint-*")


class FakeHost:
    """The mount as the auto-prune sees it."""

    def __init__(self) -> None:
        self.settled = True
        self.busy: dict[str, str] = {}
        self.refreshed: list[str] = []

    def local_changes(self, path: str) -> str | None:
        return self.busy.get(path)

    def flushed(self) -> bool:
        return self.settled

    async def refresh_dir(self, path: str) -> None:
        self.refreshed.append(path)


class FakePrune:
    """Stands in for retention.prune: records each call (directory, virtual time), and
    answers with a newest checkpoint complete from call number `complete_from` on (an
    older one removed unless `keep`, the mount's local changes, says otherwise)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.complete_from = 1
        self.fail: Exception | None = None
        self.hold: threading.Event | None = None  # set: the call waits for it

    def __call__(self, store: object, dir_path: str, keep_last: int,
                 keep_every: int | None, pattern: str, keep: Callable[[str], str | None],
                 trash_keep: float = 0.0, node: str = "") -> PruneResult:
        self.calls.append((dir_path, trio.from_thread.run_sync(trio.current_time)))
        if self.hold is not None:
            self.hold.wait(10)
        if self.fail is not None:
            e, self.fail = self.fail, None
            raise e
        complete = len(self.calls) >= self.complete_from
        new = Checkpoint(f"{dir_path}/checkpoint-2", complete=complete,
                         reasons=[retention.NEWEST])
        old = Checkpoint(f"{dir_path}/checkpoint-1", complete=True)
        why = keep(old.path)
        if why:
            old.kept_for(retention.BUSY, why)
        result = PruneResult(dir_path, pattern, keep_last, keep_every)
        result.checkpoints = [new, old]
        return result

    def dirs(self) -> list[str]:
        return [d for d, _ in self.calls]


def put(path: str) -> Op:
    return Op(0, "put_file", path)


async def soon(check: Callable[[], object], timeout: float = 10.0) -> None:
    """Until `check` holds (at most `timeout` real seconds). It waits in a thread: the
    stand-in prune runs in one too, as the real one does, and the virtual clock jumps only
    when no task has anything to do but wait for a deadline. So the clock moves to the
    auto-prune's own deadlines, and never while its prune runs."""
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"not within {timeout}s: {check}"
        await trio.to_thread.run_sync(time.sleep, 0.0005)


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in zip(times, times[1:], strict=False)]


def on_clock(tmp_path: Path, body: Callable[[AutoPruner, FakeHost, FakePrune],
                                             Awaitable[None]]) -> None:
    """Run `body(ap, host, prune)` with the auto-prune task running on a virtual clock."""
    host, prune = FakeHost(), FakePrune()
    ap = AutoPruner(LocalStore(tmp_path), POLICY, host, prune=prune)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(ap.run)
            await body(ap, host, prune)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# ---------------------------------------------------------------------------- triggers
def test_a_checkpoint_saved_file_by_file_is_pruned_once_after_a_quiet_delay(
        tmp_path: Path) -> None:
    async def body(ap: AutoPruner, host: FakeHost, prune: FakePrune) -> None:
        start = trio.current_time()
        ops = [Op(0, "put_dir", "run/checkpoint-1"), put("run/checkpoint-1/config.json"),
               put("run/checkpoint-1/model.safetensors"),
               Op(0, "put_dir", "run/checkpoint-1/global_step1"),
               put("run/checkpoint-1/global_step1/optim.pt"),
               Op(0, "rename_file", "run/checkpoint-1/a.tmp", "run/checkpoint-1/a")]
        for op in ops:  # one a second: each within the quiet delay of the one before
            ap.notify(op)
            ap.notify(put("run/runs/events.out"))  # no checkpoint: no trigger
            await trio.sleep(1.0)
        last = start + len(ops) - 1.0
        assert ap.waiting == ["run"]
        await trio.sleep_until(last + 1.9)
        assert prune.calls == []
        await soon(lambda: ap.runs == 1)
        [(parent, at)] = prune.calls
        assert parent == "run" and last + 2.0 <= at < last + 2.5
        assert host.refreshed == ["run"]  # the mount's view of it is listed again
        assert ap.removed == 1 and ap.waiting == []
        await trio.sleep(3600)  # complete: nothing runs again
        assert len(prune.calls) == 1

    on_clock(tmp_path, body)


def test_requests_are_coalesced_per_directory(tmp_path: Path) -> None:
    async def body(ap: AutoPruner, host: FakeHost, prune: FakePrune) -> None:
        for i in range(10):  # the files of one checkpoint in each directory
            ap.notify(put(f"a/checkpoint-1/w{i}.pt"))
            ap.notify(put(f"b/c/checkpoint-1/w{i}.pt"))
            ap.notify(put(f"checkpoint-1/w{i}.pt"))  # at the root
            await trio.sleep(0.1)
        await soon(lambda: ap.runs == 3)
        assert sorted(prune.dirs()) == ["", "a", "b/c"]

        # a request while its directory's prune runs: one more prune after it
        prune.hold = threading.Event()
        ap.notify(put("a/checkpoint-1/x.pt"))
        await soon(lambda: len(prune.calls) == 4)
        for _ in range(5):
            ap.notify(put("a/checkpoint-1/y.pt"))
        prune.hold.set()
        prune.hold = None
        await soon(lambda: ap.runs == 5)
        await trio.sleep(60)
        assert prune.dirs()[3:] == ["a", "a"] and ap.runs == 5

    on_clock(tmp_path, body)


def test_a_due_prune_waits_for_this_mounts_uploads(tmp_path: Path) -> None:
    """Until this mount's chunks and ops are in the store, its newest checkpoint cannot
    be complete: the prune waits for them, at most settle_max."""
    async def body(ap: AutoPruner, host: FakeHost, prune: FakePrune) -> None:
        host.settled = False
        start = trio.current_time()
        ap.notify(put("run/checkpoint-1/w.pt"))
        await trio.sleep(30)
        assert prune.calls == []
        host.settled = True
        await soon(lambda: ap.runs == 1)

        host.settled = False  # never settles: runs after settle_max all the same
        ap.notify(put("run/checkpoint-1/w2.pt"))
        start = trio.current_time()
        await trio.sleep_until(start + ap.quiet + ap.settle_max - 0.1)
        assert ap.runs == 1
        await soon(lambda: ap.runs == 2)

    on_clock(tmp_path, body)


class Shelf:
    """The checkpoint directories run/checkpoint-N of a stand-in store, each complete
    from a virtual time on (once its uploads have landed); its prune applies the policy
    of retention.plan: the newest keep_last, the newest complete one and all newer."""

    def __init__(self) -> None:
        self.complete_at: dict[int, float] = {}  # step -> when it is complete
        self.most = 0  # the most directories seen at once

    def __len__(self) -> int:
        return len(self.complete_at)

    def prune(self, store: object, dir_path: str, keep_last: int, keep_every: int | None,
              pattern: str, keep: Callable[[str], str | None], trash_keep: float = 0.0,
              node: str = "") -> PruneResult:
        now = trio.from_thread.run_sync(trio.current_time)
        result = PruneResult(dir_path, pattern, keep_last, keep_every)
        steps = sorted(self.complete_at, reverse=True)
        newest = next((i for i, s in enumerate(steps) if self.complete_at[s] <= now), None)
        for i, step in enumerate(steps):
            cp = Checkpoint(f"{dir_path}/checkpoint-{step}", step=step,
                            complete=self.complete_at[step] <= now)
            if i < keep_last:
                cp.kept_for(retention.NEWEST, "newest")
            if newest is None or i <= newest:
                cp.kept_for(retention.LATEST, "the newest complete one, or newer")
            if not cp.keep and (why := keep(cp.path)):
                cp.kept_for(retention.BUSY, why)
            result.checkpoints.append(cp)
        for cp in result.removed:
            assert cp.step is not None
            del self.complete_at[cp.step]
        return result


def test_saves_back_to_back_are_pruned_after_each_one(tmp_path: Path) -> None:
    """A save every 1.5 s (a file every 0.25 s, its uploads in the store 1 s after its
    end), so the mount is never quiet for 2 s and never drained: each new checkpoint
    prunes the directory at once, and at no moment does it hold more than keep-last + 2
    checkpoint directories. The clock moves only by the test's own steps, each followed
    by whatever prune fell due, so the bound is checked at every step."""
    keep_last = 3
    host, shelf = FakeHost(), Shelf()
    host.settled = False  # uploads never drain while training runs
    ap = AutoPruner(LocalStore(tmp_path), Policy(keep_last, None, "checkpoint-*"), host,
                    prune=shelf.prune)
    clock = trio.testing.MockClock()

    async def step(seconds: float) -> None:
        clock.jump(seconds)
        await trio.testing.wait_all_tasks_blocked()
        while ap.running is not None:  # a prune in its thread: until it is done
            await trio.to_thread.run_sync(time.sleep, 0.001)
            await trio.testing.wait_all_tasks_blocked()
        shelf.most = max(shelf.most, len(shelf))
        assert len(shelf) <= keep_last + 2, (trio.current_time(), sorted(shelf.complete_at))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(ap.run)
            for n in range(1, 31):
                shelf.complete_at[n] = float("inf")  # the next save's directory
                shelf.most = max(shelf.most, len(shelf))
                ap.notify(Op(0, "put_dir", f"run/checkpoint-{n}"))
                for part in range(4):
                    ap.notify(put(f"run/checkpoint-{n}/part-{part}.pt"))
                    await step(0.25)
                shelf.complete_at[n] = trio.current_time() + 1.0
                await step(0.5)
            assert ap.runs >= 28 and ap.errors == 0
            assert sorted(shelf.complete_at) == [28, 29, 30]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert shelf.most == keep_last + 1  # the kept ones, and the next save's directory


def test_an_incomplete_newest_checkpoint_is_pruned_again_with_backoff(
        tmp_path: Path) -> None:
    async def body(ap: AutoPruner, host: FakeHost, prune: FakePrune) -> None:
        prune.complete_from = 5  # another node's part is still uploading until then
        start = trio.current_time()
        ap.notify(put("run/checkpoint-2/rank0.pt"))
        await soon(lambda: ap.runs == 5 and ap.idle)
        times = [t - start for _, t in prune.calls]
        assert times[0] == 2 and gaps(times) == [10, 20, 40, 80]
        await trio.sleep(3600)
        assert ap.runs == 5 and ap.idle

        # a new trigger starts the backoff over; it ends RECHECK_FOR after the trigger
        prune.complete_from = 10**6
        del prune.calls[:]
        ap.notify(put("run/checkpoint-3/rank0.pt"))
        start = trio.current_time()
        await soon(lambda: not ap.idle)
        await soon(lambda: ap.idle)
        times = [t - start for _, t in prune.calls]
        steps = gaps(times)
        assert steps[:5] == [10, 20, 40, 80, 160] and set(steps[5:]) == {ap.recheck_max}
        assert times[-2] < ap.recheck_for <= times[-1]
        await trio.sleep(3600)
        assert len(prune.calls) == len(times)

    on_clock(tmp_path, body)


def test_errors_are_counted_and_never_stop_the_task(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    async def body(ap: AutoPruner, host: FakeHost, prune: FakePrune) -> None:
        prune.fail = TransientStoreError("SlowDown: please\nreduce your request rate")
        ap.notify(put("run/checkpoint-1/w.pt"))
        # a store error: one log line, and tried again 10 s later (virtual time: the retry
        # may run before this thread looks, so the error is checked in the log)
        await soon(lambda: ap.runs == 1)
        assert ("auto-prune of run failed (tried again later): run: TransientStoreError: "
                "SlowDown: please reduce your request rate") in caplog.text
        assert gaps([t for _, t in prune.calls]) == [10]
        assert ap.last_error is None and ap.errors == 1

        prune.fail = NoEntry("no such directory in the store: gone")
        ap.notify(put("gone/checkpoint-1/w.pt"))
        await soon(lambda: ap.errors == 2)
        assert ap.idle  # not a store error: not until the next trigger
        stats = ap.statistics()
        assert stats["errors"] == 2 and "NoEntry" in str(stats["last_error"])
        ap.notify(put("run/checkpoint-2/w.pt"))
        await soon(lambda: ap.runs == 2)

    on_clock(tmp_path, body)


def test_a_checkpoint_with_local_changes_is_kept_this_time(tmp_path: Path) -> None:
    """Asked from the prune's thread just before the removal, in the trio thread."""
    async def body(ap: AutoPruner, host: FakeHost, prune: FakePrune) -> None:
        host.busy["run/checkpoint-1"] = "run/checkpoint-1/x is being written on this mount"
        ap.notify(put("run/checkpoint-2/w.pt"))
        await soon(lambda: ap.runs == 1)
        assert ap.kept_busy == 1 and ap.removed == 0 and host.refreshed == []
        del host.busy["run/checkpoint-1"]
        ap.notify(put("run/checkpoint-1/x"))  # its publish triggers again
        await soon(lambda: ap.runs == 2)
        assert ap.removed == 1

    on_clock(tmp_path, body)


# ---------------------------------------------------------------------------- real store
async def mkdirs(fs: CheckpointFS, path: str) -> DirNode:
    node = fs.root
    for name in path.split("/"):
        child = node.children.get(name)
        if not isinstance(child, DirNode):
            child = await fs.mkdir(node.inode, name, 0o755)
        node = child
    return node


async def save(fs: CheckpointFS, step: int) -> None:
    d = await mkdirs(fs, f"run/checkpoint-{step}")
    for name, size in (("model.safetensors", 200_000), ("trainer_state.json", 100)):
        await write_file(fs, name, random_bytes(size, seed=step), parent=d.inode)


def pruned_since(ap: AutoPruner, runs: int) -> Callable[[], bool]:
    """A prune ran after the first `runs`, and none is running or waiting."""
    return lambda: ap.runs > runs and ap.idle


def stored_dirs(store: LocalStore, path: str) -> list[str]:
    prefix = manifests.dir_prefix(path)
    return sorted(p[len(prefix):-1] for p in store.list(prefix).prefixes)


def test_real_prune_through_a_core(tmp_path: Path) -> None:
    """Checkpoints saved through a CheckpointFS: after each one, the store and this
    mount's view (at once, not a --metadata-ttl later) keep the newest 2; a checkpoint
    with a file still being written here is kept until that file is closed."""
    store = LocalStore(tmp_path / "store")

    async def main() -> None:
        async with core(tmp_path) as fs, trio.open_nursery() as nursery:
            fs.opt.metadata_ttl = 3600.0  # only the prune's own refresh can update the view
            ap = AutoPruner(fs.store.store, POLICY, fs, quiet=0.1)
            fs.publisher.on_applied = ap.notify
            await nursery.start(ap.run)
            runs = await mkdirs(fs, "run/runs")
            await write_file(fs, "events.out", b"scalars", parent=runs.inode)
            for step in (100, 200, 300, 400):
                before = ap.runs
                await save(fs, step)
                await wait_until_async(pruned_since(ap, before),
                                       what=f"a prune after step {step}")
                kept = [f"checkpoint-{s}" for s in (100, 200, 300, 400) if s <= step][-2:]
                assert stored_dirs(store, "run") == sorted([*kept, "runs"])
                run_dir = fs.dir_at("run")
                assert run_dir is not None and sorted(run_dir.children) == sorted(
                    [*kept, "runs"])
            assert ap.removed == 2 and ap.errors == 0

            # a file being written in checkpoint-300 (open, not closed) keeps it
            d300 = fs.dir_at("run/checkpoint-300")
            assert d300 is not None
            fh, _ = await fs.create(d300.inode, "late.bin", 0o644, os.O_WRONLY)
            await fs.write(fh, 0, b"late")
            for step in (500, 600):
                await save(fs, step)
            await wait_until_async(lambda: ap.kept_busy >= 1 and ap.idle)
            assert stored_dirs(store, "run") == [
                "checkpoint-300", "checkpoint-500", "checkpoint-600", "runs"]
            before = ap.runs
            await fs.flush(fh)  # its publish triggers a prune, which removes it now
            await fs.release(fh)
            await wait_until_async(pruned_since(ap, before))
            assert stored_dirs(store, "run") == ["checkpoint-500", "checkpoint-600", "runs"]
            assert store.get(manifests.file_key("run/runs/events.out"))
            assert ap.statistics()["removed"] == 4
            nursery.cancel_scope.cancel()

    run(main)
