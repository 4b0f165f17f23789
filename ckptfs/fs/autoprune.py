"""Auto-prune: a mount's --keep-last policy, run after it writes into a checkpoint."""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from ckptfs.common.errors import StoreError
from ckptfs.pipeline.journal import Op
from ckptfs.pipeline.publisher import RetryingStore
from ckptfs.store.base import Store
from ckptfs.tools import retention
from ckptfs.tools.retention import PruneResult

log = logging.getLogger(__name__)

#: seconds without a newer trigger for a directory before it is pruned: a checkpoint
#: saved file by file gives one prune, not one per file
QUIET = 2.0
#: seconds a due prune waits at most for this mount's uploads and metadata ops to drain
#: (until then its newest checkpoint cannot be complete, and the prune would keep it all)
SETTLE_MAX = 300.0
#: re-runs while the newest checkpoint is incomplete (another node's part still
#: uploading): first after RECHECK_FIRST s, doubling up to RECHECK_MAX s, for at most
#: RECHECK_FOR s after the last trigger; also after a store error
RECHECK_FIRST = 10.0
RECHECK_MAX = 300.0
RECHECK_FOR = 3600.0

#: the op kinds that trigger, and whether the path they write is a directory
TRIGGERS = {"put_file": False, "put_dir": True, "rename_file": False, "rename_dir": True}

PruneFn = Callable[..., PruneResult]


@dataclass(frozen=True)
class Policy:
    """What to keep, as `ckptfs prune` takes it (retention.plan)."""

    keep_last: int
    keep_every: int | None
    pattern: str

    def __post_init__(self) -> None:
        retention.check_policy(self.keep_last, self.keep_every)

    def describe(self) -> str:
        every = f", keep-every {self.keep_every}" if self.keep_every else ""
        return f"keep-last {self.keep_last}{every}"


def checkpoint_of(path: str, is_dir: bool, pattern: str) -> str | None:
    """The checkpoint directory `path` lies in (or is, when `is_dir`): its nearest
    ancestor, or itself, whose name matches `pattern`; None if there is none."""
    parts = path.split("/") if path else []
    for end in range(len(parts) if is_dir else len(parts) - 1, 0, -1):
        if fnmatch.fnmatchcase(parts[end - 1], pattern):
            return "/".join(parts[:end])
    return None


def written_checkpoint(op: Op, pattern: str) -> str | None:
    """The checkpoint directory `op` wrote into or renamed to, or None if it wrote into
    none."""
    is_dir = TRIGGERS.get(op.kind)
    path = op.path2 if op.kind.startswith("rename_") else op.path
    if is_dir is None or path is None:
        return None
    return checkpoint_of(path, is_dir, pattern)


def prune_target(op: Op, pattern: str) -> str | None:
    """The directory to prune once `op` is in the store (the parent of the checkpoint
    directory it wrote into or renamed to), or None if it wrote into none."""
    checkpoint = written_checkpoint(op, pattern)
    return None if checkpoint is None else checkpoint.rpartition("/")[0]


class Host(Protocol):
    """What the auto-prune needs of the mount (filesystem.CheckpointFS)."""

    def local_changes(self, path: str) -> str | None: ...

    def flushed(self) -> bool: ...

    async def refresh_dir(self, path: str) -> None: ...


@dataclass
class _Request:
    """A directory waiting for its prune."""

    at: float                   # trio time it is due
    since: float                # trio time of its last trigger
    rechecks: int = 0           # re-runs so far (incomplete newest checkpoint, store error)
    due_since: float | None = None  # when it first fell due (bounds the wait to settle)
    #: asked by a write into another checkpoint than the one before: that one's save has
    #: ended, so the prune is due at once, without the quiet delay or the wait to settle
    moved_on: bool = False


class AutoPruner:
    """The mount's auto-prune task (docs/OPERATIONS.md, "Pruning from the mount").

    The publisher tells it of every op applied to the store (`notify`). An op that wrote
    into a checkpoint directory (a put_file, put_dir, rename_file or rename_dir whose
    path, or destination, lies in or is a directory whose name matches the pattern; the
    nearest such one) asks for a prune of that directory's parent. Requests are
    coalesced per parent: it runs QUIET seconds after the last one, once this mount's
    uploads have drained (at most SETTLE_MAX later), one prune at a time in a thread. A
    write into another checkpoint directory than the last one written there (the next
    save began) makes the prune due at once, without either wait: saves that come back
    to back, never quiet for QUIET seconds and never drained, are pruned after each one.
    retention.prune keeps the newest complete checkpoint and everything newer, so a
    checkpoint still being written is never removed; while the newest one is incomplete
    (another node still uploading its part), the prune runs again later (RECHECK_*).
    A checkpoint directory with changes of this mount not yet in the store is kept this
    time (filesystem.local_changes); its changes trigger again once they are applied.
    Errors are logged in one line and counted, and never reach the mount.
    """

    def __init__(self, store: Store, policy: Policy, host: Host, quiet: float = QUIET,
                 prune: PruneFn = retention.prune, trash_keep: float = 0.0,
                 node: str = "") -> None:
        self.store: Store = RetryingStore(store)  # type: ignore[assignment]
        self.policy = policy
        self.trash_keep = trash_keep  # what it removes stays in the trash this long
        self.node = node
        self.host = host
        self.quiet = quiet
        self.settle_max = SETTLE_MAX
        self.recheck_first, self.recheck_max, self.recheck_for = (
            RECHECK_FIRST, RECHECK_MAX, RECHECK_FOR)
        self._prune = prune
        self.limiter = trio.CapacityLimiter(1)
        self.limiter.name = "autoprune"  # type: ignore[attr-defined]
        self._requests: dict[str, _Request] = {}
        self._writing: dict[str, str] = {}  # directory -> the checkpoint last written in it
        self._wake = trio.Event()
        self.runs = 0
        self.removed = 0
        self.kept_busy = 0
        self.errors = 0
        self.last_error: str | None = None
        self.last_run: float | None = None  # Unix time the last prune ended
        self.running: str | None = None  # the directory being pruned

    # -- requests --------------------------------------------------------------------
    def notify(self, op: Op) -> None:
        """An op is in the store (Publisher.on_applied): ask for a prune if it wrote into
        a checkpoint directory."""
        checkpoint = written_checkpoint(op, self.policy.pattern)
        if checkpoint is None:
            return
        parent = checkpoint.rpartition("/")[0]
        now = trio.current_time()
        before = self._writing.get(parent)
        self._writing[parent] = checkpoint
        waiting = self._requests.get(parent)
        if (before is not None and before != checkpoint) or (waiting is not None
                                                             and waiting.moved_on):
            at = now if waiting is None else min(waiting.at, now)
            self._requests[parent] = _Request(at=at, since=now, moved_on=True)
        else:
            self._requests[parent] = _Request(at=now + self.quiet, since=now)
        self._wake.set()

    @property
    def waiting(self) -> list[str]:
        """The directories whose prune is requested and not yet run."""
        return sorted(self._requests)

    @property
    def idle(self) -> bool:
        """No prune is running or waiting."""
        return self.running is None and not self._requests

    async def _next_due(self) -> tuple[str, _Request]:
        """Wait for the next directory to prune: due, and this mount settled."""
        while True:
            now = trio.current_time()
            due = sorted((r.at, p) for p, r in self._requests.items() if r.at <= now)
            for _, parent in due:
                req = self._requests[parent]
                if req.due_since is None:
                    req.due_since = now
                if (req.moved_on or self.host.flushed()
                        or now - req.due_since >= self.settle_max):
                    return parent, self._requests.pop(parent)
                req.at = now + self.quiet  # uploads still draining: look again then
            self._wake = trio.Event()
            deadline = min((r.at for r in self._requests.values()), default=float("inf"))
            with trio.move_on_at(deadline):
                await self._wake.wait()

    # -- the task --------------------------------------------------------------------
    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Prune each requested directory when due, forever; cancel to stop."""
        task_status.started()
        while True:
            parent, req = await self._next_due()
            await self._run_one(parent, req)

    async def finish(self) -> None:
        """At unmount, once everything is flushed: run the prunes still waiting, once."""
        for parent in self.waiting:
            req = self._requests.pop(parent, None)
            if req is not None:
                await self._run_one(parent, req, final=True)

    async def _run_one(self, parent: str, req: _Request, final: bool = False) -> None:
        """Prune `parent` once. Unless `final` (at unmount), refresh this mount's view
        of it, and run it again later if that is worth it."""
        self.running = parent
        try:
            await self._prune_once(parent, req, final)
        finally:
            self.running = None

    async def _prune_once(self, parent: str, req: _Request, final: bool) -> None:
        shown = parent or "/"
        try:
            result = await trio.to_thread.run_sync(self._prune_sync, parent,
                                                   limiter=self.limiter,
                                                   abandon_on_cancel=True)
        except Exception as e:  # noqa: BLE001 - never breaks the mount: logged, counted
            self.errors += 1
            self.last_error = f"{shown}: {type(e).__name__}: {' '.join(str(e).split())}"
            retry = not final and isinstance(e, StoreError) and self._again(parent, req)
            log.warning("auto-prune of %s failed%s: %s", shown,
                        " (tried again later)" if retry else "", self.last_error)
            return
        self.runs += 1
        self.last_run = time.time()
        self.last_error = None
        for cp in result.removed:
            log.info("auto-prune: removed %s (%s)", cp.path, self.policy.describe())
        for cp in result.kept:
            if retention.BUSY in cp.reasons:
                self.kept_busy += 1
                log.info("auto-prune: kept %s this time: %s", cp.path,
                         cp.detail[cp.reasons.index(retention.BUSY)])
        self.removed += len(result.removed)
        if result.removed and not final:
            try:  # this mount's view drops them now, not a --metadata-ttl later
                await self.host.refresh_dir(parent)
            except Exception as e:  # noqa: BLE001 - the view catches up at the next listing
                log.warning("auto-prune: cannot list %s again: %s", shown, e)
        newest = result.checkpoints[0] if result.checkpoints else None
        if (not final and newest is not None and not newest.complete
                and self._again(parent, req)):
            log.debug("auto-prune: %s is not complete yet: %s is pruned again later",
                      newest.path, shown)

    def _again(self, parent: str, req: _Request) -> bool:
        """Run the prune of `parent` again after a backoff, unless a newer request
        replaced it or its last trigger is RECHECK_FOR old. Whether it will."""
        now = trio.current_time()
        if parent in self._requests or now - req.since >= self.recheck_for:
            return False
        delay = min(self.recheck_max, self.recheck_first * 2 ** req.rechecks)
        self._requests[parent] = _Request(at=now + delay, since=req.since,
                                          rechecks=req.rechecks + 1)
        self._wake.set()
        return True

    # -- in a thread -----------------------------------------------------------------
    def _prune_sync(self, parent: str) -> PruneResult:
        # the one call of retention.prune
        return self._prune(self.store, parent, self.policy.keep_last, self.policy.keep_every,
                           self.policy.pattern, trash_keep=self.trash_keep, node=self.node,
                           keep=self._local_changes)

    def _local_changes(self, path: str) -> str | None:
        """host.local_changes, asked from the prune's thread just before a removal."""
        try:
            return trio.from_thread.run_sync(self.host.local_changes, path)
        except (trio.RunFinishedError, trio.Cancelled):
            return "the mount is stopping"

    def statistics(self) -> dict[str, object]:
        """`autoprune` in `ckptfs status --json` (docs/OPERATIONS.md)."""
        return {"keep_last": self.policy.keep_last, "keep_every": self.policy.keep_every,
                "pattern": self.policy.pattern, "runs": self.runs, "removed": self.removed,
                "kept_busy": self.kept_busy, "errors": self.errors,
                "last_error": self.last_error, "last_run": self.last_run,
                "running": self.running, "waiting": self.waiting}
