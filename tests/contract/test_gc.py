"""`ckptfs gc` on crafted stores, local and SeaweedFS S3: what each step keeps, restores,
sets aside and frees; the races of docs/FORMAT.md ("Garbage collection") with a
controlled interleaving: gc killed at every crash point, two runs at once, a skewed
clock on the gc node, a directory rename in flight during the listing. The writer's
race (a dedup just before the mark) is in tests/core/test_gc_race.py, a real rotation through
a mount in tests/fuse/test_gc_rotation.py."""

from __future__ import annotations

import json
import os
import pty
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
from crafting import (
    CHUNK,
    StoreUnderTest,
    checkpoint,
    make_st,
    put_file,
    read_back,
    snapshot,
    stored_names,
)
from mounting import CKPTFS, run_cli
from pipeline_helpers import staged
from seaweed import SeaweedServer
from support import random_bytes, wait_until_async

from ckptfs.cli.output import human
from ckptfs.common.errors import NotFoundError
from ckptfs.format import manifests
from ckptfs.format.codec import chunk_hash, encode_chunk
from ckptfs.format.manifests import Manifest, chunk_key, fossil_key
from ckptfs.pipeline.cache import LocalCache, StagingFile
from ckptfs.pipeline.journal import Journal
from ckptfs.pipeline.publisher import Publisher
from ckptfs.store.base import ObjectInfo, Store
from ckptfs.store.faulty import FaultyStore
from ckptfs.store.local import LocalStore
from ckptfs.tools import gc, inspection
from ckptfs.tools.gc import GcError, GcReport

DAY = 86400.0


@pytest.fixture
def local(local_store: LocalStore) -> StoreUnderTest:
    return StoreUnderTest(local_store, str(local_store.root), [])


def put_chunk(store: Store, data: bytes) -> str:
    h = chunk_hash(data)
    store.put(chunk_key(h), encode_chunk(data)[0])
    return h


def age(store: Store, key: str, seconds: float) -> None:
    """Make an object of a directory store look `seconds` old (its mtime)."""
    assert isinstance(store, LocalStore)
    path = store.local_path(key)
    assert path is not None
    then = time.time() - seconds
    os.utime(path, (then, then))


def collect(store: Store, grace: float = 0.0, **kw: object) -> GcReport:
    return gc.collect(store, grace, **kw)  # type: ignore[arg-type]


def an_hour_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make gc runs from now on take the store's clock as more than SETTLED_AFTER ahead:
    a fossil set aside beside a copy of its chunk is then settled, and deleted."""
    real_store_time = gc.store_time
    monkeypatch.setattr(gc, "store_time",
                        lambda store: real_store_time(store) + gc.SETTLED_AFTER + 60.0)


def files_of(store: Store) -> dict[str, bytes]:
    """Every file of the store as a reader reads it (fossils/ included)."""
    return {f.path: read_back(store, f.path, fossils=True)
            for f in inspection.list_files(store) if f.target is None}


# ---------------------------------------------------------------------------- the steps
def test_mark_then_sweep_frees_exactly_the_unreferenced_chunks(st: StoreUnderTest) -> None:
    """Run 1 sets the chunks of deleted files aside (renamed to fossils/, readable), run 2
    frees them; the files that remain read back exactly, fsck --deep is clean, and a
    third run has nothing to do."""
    checkpoint(st.store, "step-1")
    checkpoint(st.store, "step-2")
    old = {h for h, _ in manifest_chunks(st.store, "step-1/model.pt")}
    want = files_of(st.store)
    st.store.delete(manifests.file_key("step-1/model.pt"))
    del want["step-1/model.pt"]
    before = stored_names(st.store)

    r1 = st.json("gc", "--grace", "0", "--no-writers")
    assert stored_names(st.store) == before - old
    assert stored_names(st.store, manifests.FOSSILS) == old
    assert r1["fossilized"] == {"count": 4, "bytes": stored_bytes(old, st.store, True)}
    assert r1["freed"] == {"count": 0, "bytes": 0} and r1["manifests"]["count"] == 3  # type: ignore[index]
    assert files_of(st.store) == want
    fsck = inspection.fsck(st.store, deep=True)
    assert fsck.clean and fsck.fossils == 4 and fsck.garbage_chunks == 0, fsck.to_dict()

    r2 = st.json("gc", "--grace", "0", "--no-writers")
    assert r2["freed"]["count"] == 4 and r2["fossilized"]["count"] == 0  # type: ignore[index]
    assert stored_names(st.store, manifests.FOSSILS) == set()
    assert stored_names(st.store) == before - old
    assert {p: read_back(st.store, p) for p in want} == want  # from chunks/ alone
    fsck = inspection.fsck(st.store, deep=True)
    assert fsck.clean and fsck.fossils == 0 and fsck.garbage_chunks == 0
    r3 = st.json("gc", "--grace", "0", "--no-writers")
    assert (r3["fossilized"], r3["freed"], r3["restored"]) == ({"count": 0, "bytes": 0},) * 3


def manifest_chunks(store: Store, path: str) -> tuple[tuple[str, int], ...]:
    return manifests.Manifest.from_json(store.get(manifests.file_key(path))).chunks


def stored_bytes(names: set[str], store: Store, fossils: bool = False) -> int:
    key = fossil_key if fossils else chunk_key
    return sum(store.head(key(h)) or 0 for h in names)


def test_young_chunks_and_fossils_wait_for_the_grace(st: StoreUnderTest,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With a grace of an hour, a fresh unreferenced chunk is kept, and so is a fresh
    fossil; a fossil that a file needs is restored at once, young or not, and one whose
    chunk a writer uploaded again is deleted as a duplicate once it is settled (an hour
    old: until then it may be the copy of a move still in flight)."""
    garbage = put_chunk(st.store, random_bytes(1000))
    needed = put_file(st.store, "a.bin", random_bytes(2 * CHUNK))
    st.store.rename(chunk_key(needed[0]), fossil_key(needed[0]))  # set aside, then named
    st.store.copy(chunk_key(needed[1]), fossil_key(needed[1]))  # named, and uploaded again
    unneeded = put_chunk(st.store, random_bytes(1000))
    st.store.rename(chunk_key(unneeded), fossil_key(unneeded))

    r = collect(st.store, 3600.0)
    assert (r.kept_chunks.count, r.chunks_referenced.count, r.fossilized.count) == (1, 2, 0)
    assert (r.restored.count, r.kept_fossils.count, r.freed.count) == (1, 2, 0)
    assert stored_names(st.store) == {garbage, *needed}
    assert stored_names(st.store, manifests.FOSSILS) == {unneeded, needed[1]}
    assert read_back(st.store, "a.bin") == read_back(st.store, "a.bin", fossils=True)
    an_hour_later(monkeypatch)
    r = collect(st.store, 7200.0)
    assert (r.restored.count, r.kept_fossils.count, r.freed.count) == (1, 1, 0)
    assert stored_names(st.store, manifests.FOSSILS) == {unneeded}


def test_old_enough_is_decided_by_the_store_clock(local: StoreUnderTest) -> None:
    """Only objects written at least --grace before the store's clock are acted on (a
    directory store: its files' mtimes, set here to the past)."""
    old_chunk = put_chunk(local.store, random_bytes(100))
    new_chunk = put_chunk(local.store, random_bytes(100))
    age(local.store, chunk_key(old_chunk), 2 * DAY)
    r = collect(local.store, DAY)
    assert (r.fossilized.count, r.kept_chunks.count) == (1, 1)
    assert stored_names(local.store, manifests.FOSSILS) == {old_chunk}
    r = collect(local.store, DAY)  # a fossil gets a new mtime: its own grace starts now
    assert (r.freed.count, r.kept_fossils.count) == (0, 1)
    age(local.store, fossil_key(old_chunk), DAY + 60)
    r = collect(local.store, DAY)
    assert r.freed.count == 1 and stored_names(local.store) == {new_chunk}


def test_dry_run_changes_nothing(st: StoreUnderTest) -> None:
    checkpoint(st.store, "step-1")
    put_chunk(st.store, random_bytes(100))
    gone = put_chunk(st.store, random_bytes(200))
    st.store.rename(chunk_key(gone), fossil_key(gone))
    before = snapshot(st.store)
    r = st.cli("gc", "--grace", "0", "--no-writers", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert snapshot(st.store) == before
    assert "1 (116 B) would be set aside as fossils" in r.stdout  # 16 B of header each
    assert "1 (216 B) would be freed" in r.stdout and "nothing was changed" in r.stdout
    d = st.json("gc", "--grace", "0", "--no-writers", "--dry-run")
    assert d["dry_run"] is True and d["fossilized"]["count"] == 1  # type: ignore[index]
    assert d["freed"]["count"] == 1 and snapshot(st.store) == before  # type: ignore[index]


def test_the_summary_and_its_numbers(local: StoreUnderTest) -> None:
    checkpoint(local.store, "step-1")
    garbage = random_bytes(3000)
    put_chunk(local.store, garbage)
    r = local.cli("gc", "--grace", "0", "--no-writers")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # no progress lines: a quick run
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [
        "store", "manifests", "fossils", "chunks", "done"]
    assert "2 read" in lines[1] and "5 chunks referenced" in lines[1]
    assert f"6 ({human(3 * CHUNK + 100 + 11 + 6 * 16 + 3000)})" in lines[3]
    assert "1 (2.9 KiB) set aside as fossils" in lines[3]
    assert "freed 0 B" in lines[4] and "2.9 KiB set aside now is freed by a run 0s" in lines[4]


# ---------------------------------------------------------------------------- refusals
def test_what_gc_refuses_is_one_line_and_exit_2(tmp_path: Path, st: StoreUnderTest,
                                                seaweed: SeaweedServer) -> None:
    checkpoint(st.store, "step-1")
    plain = tmp_path / "plain"
    plain.mkdir()
    cases = [
        ([st.url, "--grace", "-1h"], "invalid value '-1h' for --grace"),
        ([st.url, "--grace", "ten"], "invalid value 'ten' for --grace"),
        ([st.url, "--grace", "30m"], "add --no-writers"),
        ([st.url, "--grace", "0"], "add --no-writers"),
        ([str(plain)], "not a ckptfs store"),
        ([str(tmp_path / "nowhere")], "does not exist"),
        (["ftp://x/y"], "unsupported store URL"),
        ([f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}", "--endpoint-url",
          seaweed.endpoint], "does not exist"),
    ]
    before = snapshot(st.store)
    for args, why in cases:
        extra = st.extra if args[0] == st.url else []
        r = run_cli("gc", *args, *extra, check=False, timeout=60)
        assert r.returncode == 2 and r.stdout == "", (args, r.stdout, r.stderr)
        assert r.stderr.startswith("ckptfs: ") and r.stderr.count("\n") == 1, r.stderr
        assert why in r.stderr, (args, r.stderr)
    assert snapshot(st.store) == before
    for grace in ("30s", "15m", "24h", "7d", "0", "90"):
        r = st.cli("gc", "--grace", grace, "--no-writers", "--dry-run")
        assert r.returncode == 0, r.stderr


def test_an_unreadable_manifest_stops_gc_before_it_changes_anything(
        st: StoreUnderTest) -> None:
    """A manifest that cannot be parsed names chunks nobody can know: gc must not take
    it for 'no references'. It stops (exit 2, one line naming it) before any step."""
    checkpoint(st.store, "step-1")
    put_chunk(st.store, random_bytes(100))
    st.store.put(manifests.file_key("step-2/model.pt"), b'{"v": 1, "size": ')
    st.store.put(manifests.file_key("step-3/model.pt"), b'{"v": 2, "size": 1, "mode": '
                 b'33188, "mtime_ns": 0, "chunks": [["' + b"a" * 32 + b'", 1]]}')
    before = snapshot(st.store)
    r = st.cli("gc", "--grace", "0", "--no-writers")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "unreadable manifest files/step-" in r.stderr and "gc stopped" in r.stderr
    assert snapshot(st.store) == before
    with pytest.raises(GcError):
        collect(st.store)


# ---------------------------------------------------------------------------- fsck
def test_fsck_counts_fossils_and_never_calls_them_strays(st: StoreUnderTest) -> None:
    checkpoint(st.store, "step-1")
    put_chunk(st.store, random_bytes(500))
    named = put_file(st.store, "a.bin", random_bytes(100))[0]
    collect(st.store)
    st.store.rename(chunk_key(named), fossil_key(named))  # as if named after the mark
    st.store.put(f"{manifests.GC}clock-0123456789abcdef", b"")  # left by a killed run
    report = inspection.fsck(st.store)
    assert report.clean and report.strays == [], report.to_dict()
    assert (report.fossils, report.referenced_fossils) == (2, 1)
    r = st.cli("fsck")
    assert r.returncode == 0, r.stdout
    assert "fossils      2 (" in r.stdout and "set aside by gc" in r.stdout
    assert "1 of them named by a file" in r.stdout and "outside" not in r.stdout
    assert inspection.verify(st.store, "a.bin", deep=True).complete  # readable as a fossil
    d = json.loads(st.cli("fsck", "--json").stdout)
    assert (d["fossils"], d["referenced_fossils"], d["strays"]) == (2, 1, [])


# ---------------------------------------------------------------------------- (b) crashes
#: where gc can be killed; the store's own rename step is named by the store kind
GC_CRASH_POINTS = ["gc_clock_probe", "gc_references_read", "gc_fossil_restored",
                   "gc_fossil_freed", "gc_swept", "gc_chunk_fossilized",
                   "gc_chunk_fossilized:3"]
RENAME_CRASH_POINTS = {"local": ["store_rename_touched", "store_rename_touched:2"],
                       "s3": ["store_rename_copied", "store_rename_copied:2"],
                       "azure": ["store_rename_copied"], "gcs": ["store_rename_copied"]}


def every_state(store: Store) -> dict[str, bytes]:
    """A store with something for every step: live files, garbage chunks, referenced
    fossils (with and without their chunk), old unreferenced fossils. Returns the
    files' bytes."""
    checkpoint(store, "run/step-1")
    checkpoint(store, "run/step-2")
    for _ in range(3):
        put_chunk(store, random_bytes(700))
    for _ in range(2):
        h = put_chunk(store, random_bytes(900))
        store.rename(chunk_key(h), fossil_key(h))
    named = put_file(store, "run/late.bin", random_bytes(2 * CHUNK + 5))
    store.rename(chunk_key(named[0]), fossil_key(named[0]))  # named after a mark
    store.copy(chunk_key(named[1]), fossil_key(named[1]))  # and uploaded again
    return files_of(store)


def crash_cases() -> Iterator[object]:
    for kind in ("local", "s3", "azure", "gcs"):
        for point in GC_CRASH_POINTS + RENAME_CRASH_POINTS[kind]:
            if kind in ("azure", "gcs") and point not in RENAME_CRASH_POINTS[kind]:
                continue  # their own rename only: the rest is the same code as on S3
            if kind == "s3" and point not in ("gc_fossil_restored", "gc_chunk_fossilized",
                                              *RENAME_CRASH_POINTS["s3"]):
                continue  # nothing S3-specific: the local run covers it
            yield pytest.param(kind, point, id=f"{kind}-{point}")


@pytest.mark.parametrize(("kind", "point"), list(crash_cases()))
def test_gc_killed_at_any_point_loses_nothing(kind: str, point: str,
                                              request: pytest.FixtureRequest,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """gc killed (SIGKILL) at each crash point: every file still reads (from chunks/ or,
    as readers fall back, fossils/); then, an hour later (when the fossils beside copies
    of their chunks are settled), a complete run (grace 0) and a second one leave every
    file readable from chunks/ alone, nothing set aside, and fsck --deep clean."""
    st = make_st(kind, request)
    want = every_state(st.store)
    r = st.cli("gc", "--grace", "0", "--no-writers", env={**os.environ,
                                                         "CKPTFS_CRASH_AT": point})
    assert r.returncode == -9, (point, r.returncode, r.stdout, r.stderr)
    assert files_of(st.store) == want
    an_hour_later(monkeypatch)
    for _ in range(2):
        collect(st.store)
    assert {p: read_back(st.store, p) for p in want} == want
    assert stored_names(st.store, manifests.FOSSILS) == set()
    fsck = inspection.fsck(st.store, deep=True)
    assert fsck.clean and fsck.garbage_chunks == 0 and fsck.fossils == 0, fsck.to_dict()


class ListingGate(FaultyStore):
    """One gc run's view of the store: `before_listing()` is called when the run starts
    listing the manifests (its first scan of files/), `after_listing()` when it has read
    them all (its first scan of fossils/, the sweep); `renamed` records its moves."""

    def __init__(self, inner: Store, before_listing: Callable[[], object] = lambda: None,
                 after_listing: Callable[[], object] = lambda: None) -> None:
        super().__init__(inner)
        self.hooks = {manifests.FILES: before_listing, manifests.FOSSILS: after_listing}
        self.renamed: list[str] = []

    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        hook = self.hooks.pop(prefix, None)  # each called once
        if hook is not None:
            hook()
        return super().scan(prefix)

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        self.renamed.append(src)


def read_all(store: Store, paths: list[str]) -> dict[str, bytes]:
    """files_of() for `paths`, each read again (up to 3 times) before it counts as lost:
    a HEAD of chunks/ then one of fossils/ can both miss a chunk that a gc run restores
    (fossils/ -> chunks/) between the two."""
    out = {}
    for path in paths:
        for attempt in range(3):
            try:
                out[path] = read_back(store, path, fossils=True)
                break
            except (AssertionError, NotFoundError):
                if attempt == 2:
                    raise
                time.sleep(0.05)
    return out


def test_runs_at_once_lose_no_referenced_chunk(st: StoreUnderTest,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Four gc runs at once, three times over, on a store with every kind of object,
    that disagree: between the listings of the first run and of the other three, a file
    is published naming an old chunk that no file named (a writer that deduplicated
    against it). The first run sets that chunk aside, the others see it named. No run
    loses a chunk, no file ever stops reading (read in a loop during the runs), and the
    store ends as one run alone would leave it."""
    every_state(st.store)
    for i in range(30):  # many small chunks, so that the runs overlap
        put_file(st.store, f"many/{i}", random_bytes(300))
        put_chunk(st.store, random_bytes(301))
    want = files_of(st.store)
    want_lock = threading.Lock()  # the reader reads `want` while a run's hook adds to it
    errors: list[BaseException] = []
    reports: list[GcReport] = []

    def one(store: Store) -> None:
        try:
            reports.append(collect(store))
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            errors.append(e)

    for n in range(3):
        late = random_bytes(CHUNK, seed=100 + n)
        old = put_chunk(st.store, late)  # named by no file
        if st.local:  # old (a file's mtime may be finer than the clock probe's)
            age(st.store, chunk_key(old), DAY)
        published = threading.Event()

        def publish(path: str = f"late/{n}", data: bytes = late,
                    published: threading.Event = published) -> None:
            put_file(st.store, path, data, skip=(0,))  # the manifest alone: a dedup
            with want_lock:
                want[path] = data
            published.set()

        first = ListingGate(st.store, after_listing=publish)
        gated = [first, *(ListingGate(st.store, before_listing=partial(published.wait, 60))
                          for _ in range(3))]
        threads = [threading.Thread(target=one, args=(g,)) for g in gated]
        reports.clear()
        for t in threads:
            t.start()
        reads = 0
        while any(t.is_alive() for t in threads):  # a reader, all along
            with want_lock:
                expected = dict(want)
            assert read_all(st.store, list(expected)) == expected
            reads += 1
        for t in threads:
            t.join()
        assert not errors, errors
        assert published.is_set() and reads > 0
        assert chunk_key(old) in first.renamed  # the first run set it aside: they disagreed
        assert [r.lost for r in reports] == [[]] * 4, [r.to_dict() for r in reports]
        assert files_of(st.store) == want
    an_hour_later(monkeypatch)  # the fossils beside copies of their chunks are settled
    collect(st.store)
    collect(st.store)
    assert {p: read_back(st.store, p) for p in want} == want
    fsck = inspection.fsck(st.store, deep=True)
    assert fsck.clean and fsck.garbage_chunks == 0 and fsck.fossils == 0, fsck.to_dict()


def test_a_young_fossil_beside_its_chunk_is_kept(st: StoreUnderTest,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that finds a referenced fossil beside a copy of its chunk keeps the fossil
    while it is young: it may be the copy of another run's move (setting the chunk aside)
    that has yet to delete the chunk. Deleting it as a duplicate then lost the chunk, both
    copies gone, when four runs disagreed at once on GCS. Once the move deletes the chunk
    readers find the fossil, and the next run restores it; a settled duplicate (an hour
    old) is deleted."""
    data = random_bytes(2 * CHUNK)
    h, dup = put_file(st.store, "a.bin", data)
    for name in (h, dup):
        st.store.copy(chunk_key(name), fossil_key(name))  # a move between copy and delete
    r = collect(st.store)
    assert (r.restored.count, r.kept_fossils.count, r.lost) == (0, 2, [])
    st.store.delete(chunk_key(h))  # the move of h goes on: it deletes the chunk
    assert read_back(st.store, "a.bin", fossils=True) == data
    r = collect(st.store)
    assert (r.restored.count, r.kept_fossils.count) == (1, 1)
    assert read_back(st.store, "a.bin") == data
    an_hour_later(monkeypatch)
    r = collect(st.store)
    assert (r.restored.count, r.kept_fossils.count) == (1, 0)
    assert stored_names(st.store, manifests.FOSSILS) == set()
    assert read_back(st.store, "a.bin") == data


# ---------------------------------------------------------------------------- (c) clocks
@pytest.mark.parametrize("skew", [-10 * 365 * DAY, 10 * 365 * DAY], ids=["behind", "ahead"])
def test_the_gc_node_clock_does_not_matter(st: StoreUnderTest, skew: float, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """gc on a node whose clock is ten years off decides exactly as with a right one:
    ages come from the store's clock. A gc that took its own clock for T would (ahead)
    set aside every chunk, fresh ones included, or (behind) none (shown below). Nor does
    the writer's wall clock matter (rule W3): a manifest journaled with the clock right,
    whose chunk gc frees before the writer restarts with its clock stepped back or
    forward, has the chunk put back (from its staging file) before it is published."""
    old = put_chunk(st.store, random_bytes(100)) if st.local else None
    if old is not None:
        age(st.store, chunk_key(old), 2 * DAY)
    fresh = put_chunk(st.store, random_bytes(100))
    written = random_bytes(CHUNK + 100)
    journal, cache, staging = journaled_before_a_restart(st.store, tmp_path, "w.bin", written)
    real_time, real_time_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + skew)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(skew * 1e9))

    r = collect(st.store, DAY, dry_run=True)
    assert r.kept_chunks.count == 3 and r.fossilized.count == (old is not None)
    assert abs(r.store_time - real_time()) < 60
    r = collect(st.store, DAY)
    assert stored_names(st.store) == {fresh, *staged_chunks(written)}
    real_store_time = gc.store_time
    # the same run with the node's clock as T: wrong both ways
    monkeypatch.setattr(gc, "store_time", lambda store: time.time())
    r = collect(st.store, DAY, dry_run=True)
    if skew > 0:
        assert r.fossilized.count == 3  # the fresh chunks would be set aside
    else:
        assert r.fossilized.count == 0 and r.kept_chunks.count == 3
    monkeypatch.setattr(gc, "store_time", real_store_time)

    collect(st.store, 0.0)  # the writer's chunks: set aside, then freed
    collect(st.store, 0.0)
    assert stored_names(st.store) == set() == stored_names(st.store, manifests.FOSSILS)
    publisher = Publisher(st.store, journal, trio.CapacityLimiter(1), "node-w", cache)
    publisher.load(journal.pending_ops())  # the restart, its clock stepped by `skew`

    async def publish() -> None:
        async with trio.open_nursery() as n:
            await n.start(publisher.run)
            await wait_until_async(lambda: publisher.pending_count == 0, timeout=30)
            n.cancel_scope.cancel()

    trio.run(publish)
    assert journal.lost_files() == [] and journal.counts() == (0, 0)
    assert read_back(st.store, "w.bin") == written  # from chunks/ alone
    assert stored_names(st.store) == set(staged_chunks(written))
    assert staging.id not in cache.staging  # released once published
    cache.close()
    journal.close()


def staged_chunks(data: bytes) -> list[str]:
    return [chunk_hash(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]


def journaled_before_a_restart(store: Store, tmp_path: Path, path: str, data: bytes
                               ) -> tuple[Journal, LocalCache, StagingFile]:
    """A writer's state once it closed `path` (its chunks stored, its manifest journaled
    and not yet PUT) and stopped: the journal, the cache holding the version's staging
    file."""
    m = Manifest(size=len(data), mode=0o100644, mtime_ns=time.time_ns(), chunks=tuple(
        (h, len(data[i * CHUNK:(i + 1) * CHUNK])) for i, h in enumerate(staged_chunks(data))),
        chunk_size=CHUNK, writer="node-w")
    for i in range(0, len(data), CHUNK):
        put_chunk(store, data[i:i + CHUNK])
    journal = Journal(str(tmp_path / "journal.sqlite"))
    cache = LocalCache(str(tmp_path / "cache"), 1 << 30)
    staging = staged(cache, data)
    journal.add_op("put_file", path, body=m.to_json(), staging_id=staging.id)
    return journal, cache, staging


# ---------------------------------------------------------------------------- (d) renames
class ListingInFlight(FaultyStore):
    """A store whose scan of files/ behaves as an S3 listing under a concurrent change:
    it walks the keys in order from a snapshot taken when it starts, yields each key that
    still exists when the walk reaches it (so keys created behind the walk are missed,
    and keys deleted ahead of it too), and calls `during` once, after the key `after`."""

    def __init__(self, inner: Store, after: str, during: Callable[[], object]) -> None:
        super().__init__(inner)
        self.after = after
        self.during = during
        self.scans = 0

    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        if prefix != manifests.FILES:
            yield from self.inner.scan(prefix)
            return
        self.scans += 1
        for key in sorted(i.key for i in self.inner.scan(prefix)):
            info = self.inner.stat(key)
            if info is not None:
                yield info
            if key == self.after and self.scans == 1:
                self.during()


@pytest.mark.parametrize("passes", [2, 1], ids=["two-listings", "one-listing"])
def test_a_directory_rename_in_flight_during_the_listing(
        st: StoreUnderTest, tmp_path: Path, passes: int, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """A directory rename z-old -> a-new is half copied (its intent in the store) when gc
    starts listing; while the listing is between the two names, the rename finishes:
    copies land behind the listing, deletes ahead of it, so the first listing misses
    a-new/f2 and a-new/sub/f3 under both names. The second listing sees them: nothing is
    set aside. With one listing (LISTING_PASSES = 1) their chunks are set aside, and
    only the fossil readers fall back to keeps them readable until a later sweep."""
    monkeypatch.setattr(gc, "LISTING_PASSES", passes)
    keep = put_file(st.store, "m/keep.bin", random_bytes(CHUNK))
    data = {name: random_bytes(CHUNK + 10) for name in ("f1", "f2", "sub/f3")}
    for name, payload in data.items():
        put_file(st.store, f"z-old/{name}", payload)
    st.store.put(f"{manifests.INTENTS}node-b-7.json", json.dumps(
        {"v": 1, "op": "rename_dir", "src": "z-old", "dst": "a-new",
         "writer": "node-b"}).encode())
    st.store.copy(manifests.file_key("z-old/f1"), manifests.file_key("a-new/f1"))
    journal = Journal(str(tmp_path / "journal.sqlite"))
    publisher = Publisher(st.store, journal, None, "node-c")  # type: ignore[arg-type]
    finished: list[int] = []
    store = ListingInFlight(st.store, manifests.file_key("m/keep.bin"),
                            lambda: finished.append(publisher.roll_forward_intents()))
    try:
        r = collect(store)
    finally:
        journal.close()
    assert finished == [1] and st.store.list(manifests.INTENTS, None).objects == []
    moved = {h for name in ("f2", "sub/f3")
             for h, _ in manifest_chunks(st.store, f"a-new/{name}")}
    assert set(keep) <= stored_names(st.store)
    if passes == 2:
        assert r.fossilized.count == 0 and r.manifests_reread >= 2, r.to_dict()
        assert moved <= stored_names(st.store)
    else:
        assert stored_names(st.store, manifests.FOSSILS) == moved
    for name, payload in data.items():
        assert read_back(st.store, f"a-new/{name}", fossils=True) == payload


# ---------------------------------------------------------------------------- the CLI
def test_progress_on_a_terminal_and_in_a_log(local: StoreUnderTest) -> None:
    """A bar on a terminal (stderr), lines every 5 s otherwise: a run shorter than that
    prints none (the summary test above); on a pseudo-terminal rich draws the steps in
    place (the cursor hidden meanwhile), the mark with its bar, then the summary."""
    checkpoint(local.store, "step-1")

    pid, fd = pty.fork()
    if pid == 0:  # the child: stderr is the terminal
        assert isinstance(local.store, LocalStore)
        os.execv(sys.executable, [*CKPTFS, "gc", str(local.store.root), "--grace", "0",
                                  "--no-writers"])
    out = b""
    while True:
        try:
            piece = os.read(fd, 4096)
        except OSError:
            break
        if not piece:
            break
        out += piece
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    text = out.decode()
    assert "gc references: " in text and "done         freed" in text, text
    drawn = text[text.index("\x1b[?25l"):text.index("\x1b[?25h")]  # rich's live rows
    assert "gc references: " in drawn and "gc mark" in drawn and "━" in drawn, text
    assert "%" in drawn and "chunks (" in drawn and "set aside" in drawn, text
    assert "[#" not in text, text  # not the plain bar of a log
    assert text.index("\x1b[?25h") < text.index("done         freed"), text
