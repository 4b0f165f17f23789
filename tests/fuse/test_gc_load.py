"""gc under load on SeaweedFS (the demonstration the gc issue asks for): two mounts keep
saving checkpoints that share chunks, deleting old ones and saving identical data again,
while `ckptfs gc` runs in a loop with a short grace (the writers' confirmation window
shortened to match). Then every file still listed reads back bit-exact, `fsck --deep` is
clean, and every chunk that is unreferenced and older than the grace is gone
(docs/FORMAT.md, "Garbage collection").

Each node keeps its last KEEP checkpoints and a milestone (step 0). A checkpoint holds:

- `family-a.bin`, `family-b.bin`: the same bytes every other step. The node begins them,
  finds their chunks in the store (dedup: the early uploads' HEADs, which it trusts for
  the confirmation window, rule W2), only then deletes its oldest checkpoint, which held
  the same bytes, and finishes them a moment later. In between no manifest names those
  chunks: once they are older than the grace, a gc run that lists the manifests then
  sets them aside under a writer that has deduplicated against them (race a). The new
  manifests name fossils (readers fall back to them) until the next run restores them.
- `model.bin`: two blocks of a pool both nodes draw from, then bytes of its own; every
  fourth step, the bytes of a step saved more than a grace before and deleted since
  (set aside or freed by then: uploaded again, rule W1).
- the milestone's chunks are named throughout: gc must never move them.

Before deleting a checkpoint, its node checks that every chunk of it is in chunks/ or
fossils/: a chunk lost from a checkpoint deleted later would go unseen at the end.
What breaking gc shows: with no fossil step (the mark deletes) or with fossils freed
before their grace, these checks find chunks of the family files gone; with referenced
chunks set aside, the milestone's chunks have moved at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mounting import Mount, Nodes, run_cli
from seaweed import SeaweedServer
from support import random_bytes, wait_until

from ckptfs.daemon import control
from ckptfs.daemon.mount import control_socket_path
from ckptfs.format import codec, manifests
from ckptfs.store import open_store
from ckptfs.store.base import RESTAMP_AFTER, Store
from ckptfs.tools import inspection
from ckptfs.tools.gc import SETTLED_AFTER

#: the chunk size of the store: files are built from blocks of exactly this size
CHUNK = 256 * 1024
#: options of every mount of the test, in one place: no trash, so that what the writers
#: delete is unreferenced at once, for gc to set aside and free during the load
MOUNT_OPTIONS = ("--chunk-size", "256K", "--trash-hours", "0")
#: the writers' confirmation window P (seconds), shortened from 10 minutes for their
#: daemons through manifests.CONFIRM_WINDOW_ENV, so that a short grace is safe
CONFIRM_WINDOW = 4.0
#: gc's grace (seconds). FORMAT.md ("Garbage collection", "Why it is safe") proves gc safe
#: beside writers when the grace exceeds W + 30 s, where W = 2P plus the time a late
#: publish's check takes: a manifest published at p names chunks its writer saw at or
#: after p - W (P to journal them at close, P more before its publisher checks them
#: again), and an S3 move may stamp a fossil up to RESTAMP_AFTER (30 s) before the chunk
#: vanished. So 2P + 30 s = 38 s; the 6 s beyond it cover the late-publish checks (a few
#: HEADs) and the whole seconds of S3's LastModified. gc refuses a grace under an hour
#: unless told --no-writers: it cannot know the writers' P, which only this test shortened.
GRACE = 44.0
assert GRACE >= 2 * CONFIRM_WINDOW + RESTAMP_AFTER + 5
#: checkpoints each node keeps besides its milestone (step 0)
KEEP = 2
#: blocks (one chunk each) that both nodes' model.bin files draw from
POOL = 8
#: the load goes on until it has shown what the test is about, and not longer: gc has set
#: chunks aside, restored some and freed some (the first chunk can be freed two graces
#: after it was written, so about 2 x GRACE), each writer has re-saved bytes deleted more
#: than a grace before (rule W1) and checked CHECKS checkpoints before deleting them
CHECKS = 8
#: the load's cap (seconds): far above what it needs (about 2 x GRACE + a gc run), so that
#: a slow machine only makes the test longer; reached, the test fails with the counts
LOAD_CAP = 600.0
#: seconds the family files stay open once the old checkpoint is deleted: well within P,
#: so that the writer still trusts, at the close, its HEADs from before the deletion
HOLD = (1.5, 3.0)
FAMILIES = ("family-a.bin", "family-b.bin")
ERRORS = "DATA LOST"


def seed_of(*parts: object) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def pool_block(i: int) -> bytes:
    return random_bytes(CHUNK, seed=seed_of("pool", i))


def family(node: str, parity: int, part: str) -> bytes:
    return random_bytes(2 * CHUNK + 1000 + parity, seed=seed_of(node, "family", parity, part))


def model(node: str, content: int) -> bytes:
    """Two pool blocks, then a chunk and a tail of this content's own."""
    blocks = random.Random(seed_of(node, "pool", content)).sample(range(POOL), 2)
    own = random_bytes(CHUNK + 1 + content % 997, seed=seed_of(node, "model", content))
    return b"".join(pool_block(i) for i in blocks) + own


def step_files(node: str, step: int, content: int) -> dict[str, bytes]:
    """The files of checkpoint `step` of `node`, its model.bin that of step `content`."""
    if step == 0:  # the milestone: bytes of its own, kept to the end
        return {"model.bin": random_bytes(2 * CHUNK + 321, seed=seed_of(node, "milestone"))}
    return {"family-a.bin": family(node, step % 2, "a"), "model.bin": model(node, content),
            "family-b.bin": family(node, step % 2, "b")}


@dataclass
class Writer:
    """One node's save loop and what it left in the store."""

    name: str
    mount: Mount
    store: Store
    rng: random.Random
    contents: dict[int, int] = field(default_factory=dict)  # kept step -> its content
    saved: dict[int, float] = field(default_factory=dict)  # step -> when (monotonic)
    deleted: list[int] = field(default_factory=list)
    contents_of_deleted: dict[int, int] = field(default_factory=dict)
    milestone: dict[str, float | None] = field(default_factory=dict)  # its chunks' store times
    family_seen: dict[int, float] = field(default_factory=dict)  # parity -> last sighting
    resaves: int = 0
    checked: int = 0

    def path(self, step: int) -> str:
        return f"ckpt/{self.name}-step-{step}"

    def save(self, step: int, content: int, delete: int | None = None) -> None:
        """Write the checkpoint under a temporary name, then rename it into place.

        The family files are begun first, and their first two chunks are found in the
        store (the early uploads' HEADs, which the writer then trusts for P: rule W2);
        only then is checkpoint `delete`, whose family files held the same bytes,
        deleted, and the family files are finished a moment later. In between, no
        manifest names those chunks: once they are older than the grace, a gc run that
        lists the manifests then sets them aside under a writer that has deduplicated
        against them (race a), and the new manifests name fossils until the next run
        restores them."""
        tmp = self.mount / f"{self.path(step)}.tmp"
        tmp.mkdir()
        files = step_files(self.name, step, content)
        # a skipped upload does not renew a sighting: let this node's last one of these
        # bytes (two steps ago) lapse, so that the early uploads HEAD them again
        time.sleep(max(0.0, self.family_seen.get(step % 2, -GRACE) + CONFIRM_WINDOW
                       - time.monotonic()))
        with contextlib.ExitStack() as open_files:
            family_files = {}
            for name in FAMILIES:
                if name in files:
                    f = family_files[name] = open_files.enter_context(open(tmp / name, "wb"))
                    f.write(files[name][:2 * CHUNK])
                    f.flush()
            # (uploaded or found in the store: an early upload leaves its chunk clean)
            wait_until(lambda: status(self.mount)["dirty_bytes"] == 0, 60,
                       "the early uploads of the family files", interval=0.02)
            if delete is not None:
                shutil.rmtree(self.mount / self.path(delete))
                self.contents_of_deleted[delete] = self.contents.pop(delete)
                self.deleted.append(delete)
            time.sleep(self.rng.uniform(*HOLD))
            for name, f in family_files.items():
                f.write(files[name][2 * CHUNK:])
        # (the last sighting: the early HEADs, or, for chunks no longer trusted at the
        # close, the HEADs that follow it; allow them a second)
        self.family_seen[step % 2] = time.monotonic() + 1
        for name, data in files.items():
            if name not in FAMILIES:
                (tmp / name).write_bytes(data)
        tmp.rename(self.mount / self.path(step))
        self.contents[step] = content
        self.saved[step] = time.monotonic()

    def content_for(self, step: int) -> int:
        """Every fourth step saves again the model of a step saved more than a grace ago
        and deleted since (if any): its chunks were set aside by then, or freed."""
        if step % 4 == 0:
            old = [s for s in self.deleted if time.monotonic() - self.saved[s] > GRACE + 5]
            if old:
                self.resaves += 1
                return self.contents_of_deleted[old[-1]]
        return step

    def run(self, stop: threading.Event) -> None:
        self.save(0, 0)
        self.mount.sync()
        self.milestone = self.stamps(0)
        assert None not in self.milestone.values(), self.milestone
        step = 1
        while not stop.is_set():
            kept = sorted(s for s in self.contents if s != 0)
            oldest = None
            if len(kept) == KEEP:
                oldest = kept[0]
                self.mount.sync()  # what this node closed is in the store: check it, whole
                self.check_complete(oldest)
            self.save(step, self.content_for(step), delete=oldest)
            step += 1

    def stamps(self, step: int) -> dict[str, float | None]:
        """The store time of each chunk of the checkpoint in chunks/ (None: not there)."""
        out = {}
        for data in step_files(self.name, step, self.contents[step]).values():
            for i in range(0, len(data), CHUNK):
                h = codec.chunk_hash(data[i:i + CHUNK])
                info = self.store.stat(manifests.chunk_key(h))
                out[h] = None if info is None else info.mtime
        return out

    def check_complete(self, step: int) -> None:
        """Every file of the checkpoint has each chunk in chunks/ or fossils/. Checked
        again before failing: a HEAD of chunks/ then one of fossils/ can both miss a
        chunk that a gc run restores (fossils/ -> chunks/) between the two."""
        names = set(step_files(self.name, step, self.contents[step]))
        for attempt in range(3):
            r = inspection.verify(self.store, self.path(step))
            if r.complete and {f.path.rpartition("/")[2] for f in r.files} == names:
                self.checked += 1
                return
            time.sleep(1 + attempt)
        raise AssertionError(f"{self.path(step)} lost data before its deletion: "
                             f"{r.to_dict()}")

    def expected(self) -> dict[str, bytes]:
        """Every file this node saved and did not delete, by its path in the mount."""
        return {f"{self.path(s)}/{name}": data for s, c in self.contents.items()
                for name, data in step_files(self.name, s, c).items()}


def status(m: Mount) -> dict[str, Any]:
    """`ckptfs status --json` of the mount, in this process."""
    return dict(next(control.request(control_socket_path(str(m.cache)), "status")))


#: the gc loop: `ckptfs gc` run after run, each answer printed as one JSON line, until the
#: file argv[1] exists (or the test process is gone). A process of its own, started before
#: any writer opens a file: a process that this one starts while a writer holds a file
#: open inherits the descriptor, and closing it (at exec) sends a FUSE flush, which
#: publishes the file as it is then, in the middle of the save.
GC_LOOP = """
import json, os, subprocess, sys, time
stop, parent = sys.argv[1], os.getppid()
while not os.path.exists(stop) and os.getppid() == parent:
    r = subprocess.run([sys.executable, "-m", "ckptfs.cli", *sys.argv[2:]],
                       capture_output=True, text=True, timeout=300)
    print(json.dumps([r.returncode, r.stdout, r.stderr]), flush=True)
    if r.returncode:
        break
    time.sleep(0.5)
"""


@dataclass
class GcLoop:
    """`ckptfs gc --grace GRACE --no-writers --json` run after run, with their reports."""

    url: str
    endpoint: list[str]
    stop_file: Path
    reports: list[dict[str, Any]] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None

    @property
    def args(self) -> list[str]:
        return ["gc", self.url, "--grace", f"{GRACE:g}", "--no-writers", "--json",
                *self.endpoint]

    @staticmethod
    def report(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
        assert returncode == 0, f"gc failed ({returncode}):\n{stdout}\n{stderr}"
        report: dict[str, Any] = json.loads(stdout)
        assert not report["lost"], report
        return report

    def once(self) -> dict[str, Any]:
        """One run, from this process (while no file is open)."""
        r = run_cli(*self.args, check=False, timeout=300)
        return self.report(r.returncode, r.stdout, r.stderr)

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", GC_LOOP, str(self.stop_file),
                                      *self.args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, text=True)

    def read(self, stop: threading.Event) -> None:
        """Collect the loop's reports until it ends (in a thread)."""
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.reports.append(self.report(*json.loads(line)))

    def stop(self) -> None:
        """Let the run in progress finish, then end the loop (kill it if it hangs)."""
        self.stop_file.touch()
        if self.proc is not None:
            try:
                self.proc.wait(300)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def total(self, what: str) -> int:
        return sum(int(r[what]["count"]) for r in self.reports)

    def worked(self) -> bool:
        return all(self.total(what) > 0 for what in ("fossilized", "restored", "freed"))


def in_threads(*jobs: Callable[[threading.Event], None], stop: threading.Event
               ) -> tuple[list[threading.Thread], list[BaseException]]:
    """Start each job(stop) in a thread; the first error stops them all."""
    errors: list[BaseException] = []

    def guarded(job: Callable[[threading.Event], None]) -> None:
        try:
            job(stop)
        except BaseException as e:
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=guarded, args=(j,), daemon=True) for j in jobs]
    for t in threads:
        t.start()
    return threads, errors


def objects(store: Store, prefix: str) -> dict[str, float]:
    """Chunk name -> store time of every object of the layout under chunks/ or fossils/."""
    out = {}
    for info in store.scan(prefix):
        name = manifests.chunk_name(info.key, prefix)
        assert name is not None, f"object outside the layout: {info.key}"
        out[name] = info.mtime
    return out


def referenced(store: Store) -> set[str]:
    """Every chunk a manifest names, read from the store directly."""
    names: set[str] = set()
    for info in store.scan(manifests.FILES):
        if not info.key.endswith("/"):
            names.update(h for h, _ in json.loads(store.get(info.key)).get("chunks", ()))
    return names


@pytest.fixture
def url(seaweed: SeaweedServer) -> Iterator[str]:
    """A store URL on a fresh bucket, dropped (with everything in it) at the end."""
    bucket = seaweed.new_bucket()
    yield f"s3://{bucket}/job-{uuid.uuid4().hex[:6]}"
    seaweed.drop_bucket(bucket)


def test_gc_in_a_loop_beside_two_writers_loses_nothing_and_frees_what_is_old(
        url: str, nodes: Nodes, seaweed: SeaweedServer, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    endpoint = ["--endpoint-url", seaweed.endpoint]
    env = {**os.environ, manifests.CONFIRM_WINDOW_ENV: f"{CONFIRM_WINDOW:g}"}
    a = nodes.mount(url, tmp_path, "a", *MOUNT_OPTIONS, *endpoint, env=env)
    (a / "ckpt").mkdir()
    b = nodes.mount(url, tmp_path, "b", *MOUNT_OPTIONS, *endpoint, env=env)
    assert (b / "ckpt").is_dir()
    stores = [open_store(url, endpoint_url=seaweed.endpoint) for _ in range(3)]
    for s in stores:
        request.addfinalizer(s.close)
    writers = [Writer(name, m, s, random.Random(name))
               for name, m, s in zip("ab", (a, b), stores, strict=False)]
    gc = GcLoop(url, endpoint, tmp_path / "stop-gc")

    stop = threading.Event()
    started = time.monotonic()
    gc.start()  # before any file is open (GC_LOOP)
    try:
        collectors, gc_errors = in_threads(gc.read, stop=threading.Event())
        loaders, errors = in_threads(*(w.run for w in writers), stop=stop)
        while not errors and not gc_errors and collectors[0].is_alive():
            if time.monotonic() - started > LOAD_CAP or (gc.worked() and all(
                    w.checked >= CHECKS and w.resaves > 0 for w in writers)):
                break
            time.sleep(0.2)
        load = time.monotonic() - started
        stop.set()
        for t in loaders:
            t.join(300)
    finally:
        gc.stop()
    for t in collectors:
        t.join(60)
    if errors or gc_errors:
        raise (errors + gc_errors)[0]
    assert gc.proc is not None and gc.proc.returncode == 0, "the gc loop ended early"
    summary = (f"{load:.0f} s of load: {gc.total('fossilized')} fossilized, "
               f"{gc.total('restored')} restored, {gc.total('freed')} freed, "
               f"{sum(r['vanished'] for r in gc.reports)} vanished in {len(gc.reports)} "
               f"gc runs; saves {[max(w.saved) for w in writers]}, re-saves "
               f"{[w.resaves for w in writers]}, checked {[w.checked for w in writers]}")
    print(summary)
    # gc did work during the load (a loop that never set aside, restored or freed a chunk
    # would prove nothing); the checks before each deletion found no chunk missing; the
    # writers uploaded again bytes whose chunks were set aside or freed
    assert gc.worked(), summary
    assert all(w.checked >= CHECKS and w.resaves > 0 for w in writers), summary

    for w in writers:
        w.mount.umount()  # exit 0: all that was closed is in the store, nothing was lost
        log = w.mount.log()
        assert ERRORS not in log, log
    late = sum(w.mount.log().count("before its late publish") for w in writers)
    print(f"late publishes re-confirmed: {late}")

    final = gc.once()  # no writer now: everything old and unreferenced goes
    cutoff = float(final["cutoff"])

    # a fresh node (empty cache) lists exactly the files kept, each bit-exact
    expected = {p: d for w in writers for p, d in w.expected().items()}
    reader = nodes.mount(url, tmp_path, "reader", *MOUNT_OPTIONS, *endpoint)
    listed = {str(p.relative_to(reader.path)) for p in (reader / "ckpt").rglob("*")
              if p.is_file()}
    assert listed == set(expected), (sorted(listed ^ set(expected)), summary)
    for path, data in expected.items():
        assert (reader / path).read_bytes() == data, path
    reader.umount()

    r = run_cli("fsck", url, "--deep", "--json", *endpoint, check=False)
    fsck = json.loads(r.stdout)
    assert r.returncode == 0 and fsck["clean"] and not fsck["problems"], r.stdout

    # the store itself: every chunk the manifests name is in chunks/ (the last run
    # restored every referenced fossil and set none aside; a referenced fossil left is a
    # young duplicate, kept until settled); everything unreferenced that is left, in
    # chunks/ or fossils/, is younger than the last run's cutoff
    store = stores[2]
    refs = referenced(store)
    chunks, fossils = objects(store, manifests.CHUNKS), objects(store, manifests.FOSSILS)
    assert refs <= chunks.keys(), sorted(refs - chunks.keys())
    settled = float(final["store_time"]) - SETTLED_AFTER
    old = {h: t for h, t in fossils.items() if h in refs and t <= settled}
    assert not old, f"settled duplicates of referenced chunks: {old}"
    fossils = {h: t for h, t in fossils.items() if h not in refs}
    old = {h: cutoff - t for h, t in chunks.items() if h not in refs and t <= cutoff}
    assert not old, f"unreferenced chunks older than the grace: {old}"
    old = {h: cutoff - t for h, t in fossils.items() if t <= cutoff}
    assert not old, f"fossils older than the grace: {old}"
    # a chunk named throughout by a manifest was never set aside (a move would re-stamp it)
    for w in writers:
        assert w.stamps(0) == w.milestone, f"the chunks of {w.path(0)} were moved"
    print(f"final run: {final['fossilized']['count']} fossilized, "
          f"{final['restored']['count']} restored, {final['freed']['count']} freed; "
          f"{len(refs)} chunks referenced, {len(chunks) - len(refs)} unreferenced and "
          f"{len(fossils)} fossils left, younger than the grace")
