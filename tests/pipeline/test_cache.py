"""LocalCache: staging files, the read cache, dirty accounting, eviction, the scan at
startup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pipeline_helpers import staged

from ckptfs.common.errors import ConfigError
from ckptfs.format import codec
from ckptfs.pipeline.cache import LocalCache

KiB = 1024


def fake_hash(i: int) -> str:
    return f"{i:032x}"


def test_cache_evicts_least_recently_used_read_cache(cache: LocalCache) -> None:
    a, b, c, d = (fake_hash(i) for i in range(4))
    for h in (a, b, c):
        cache.put_fetched(h, bytes(1000))
    cache.limit_bytes = 3000
    assert cache.used_bytes == 3000
    cache.evict()
    assert cache.evicted_bytes == 0  # not over the limit
    assert cache.locate(a) is not None  # a is now the most recently used
    cache.put_fetched(d, bytes(1000))
    cache.evict()
    assert not cache.has(b) and cache.locate(b) is None
    assert all(cache.has(h) for h in (a, c, d))
    assert not os.path.exists(os.path.join(cache.chunks_dir, b[:2], b))
    assert cache.evicted_bytes == 1000 and cache.used_bytes == 3000
    # `keep` protects a chunk just fetched even if it is the oldest
    cache.put_fetched(fake_hash(9), bytes(1000))
    cache.evict(keep={c})
    assert cache.has(c) and not cache.has(a)
    assert cache.hits >= 1 and cache.misses >= 1


def test_cache_never_evicts_dirty_data(cache: LocalCache) -> None:
    st = cache.new_staging()
    os.pwrite(st.fd, b"d" * 5000, 0)
    st.extent = 5000
    cache.set_dirty(st, 0, 5000)
    h = fake_hash(1)
    cache.add_staged_chunk(h, st, 0, 5000)
    cache.put_fetched(fake_hash(2), bytes(1000))
    cache.limit_bytes = 1000
    cache.evict()
    assert not cache.has(fake_hash(2))  # clean data went first
    assert st.id in cache.staging and os.path.exists(st.path)  # dirty data stays
    assert cache.used_bytes == 5000 > cache.limit_bytes
    # still dirty but sealed and uploaded-pending: release does not make it evictable
    st.sealed = True
    st.pending = 1
    cache.release_staging(st)
    cache.evict()
    assert st.id in cache.staging
    # uploaded: clean, so evictable
    st.pending = 0
    cache.clear_dirty(st, 0)
    cache.release_staging(st)
    assert cache.locate(h) is not None  # still readable until evicted
    cache.evict()
    assert st.id not in cache.staging and not os.path.exists(st.path)
    assert not cache.has(h) and cache.used_bytes == 0


def test_cache_clean_staging_lru(cache: LocalCache) -> None:
    files = []
    for i in range(3):
        st = staged(cache, b"s" * 1000)
        cache.add_staged_chunk(fake_hash(i), st, 0, 1000)
        cache.release_staging(st)
        files.append(st)
    assert cache.locate(fake_hash(0)) == (files[0].fd, 0)  # touch the oldest
    cache.limit_bytes = 2000
    cache.evict()
    assert [st.id in cache.staging for st in files] == [True, False, True]


def test_cache_dirty_accounting(cache: LocalCache) -> None:
    st = cache.new_staging()
    cs = 64 * KiB
    cache.set_dirty(st, 0, 100)
    assert cache.dirty_bytes == 100
    cache.set_dirty(st, 0, 150)  # the same chunk grew: replaced, not added
    assert cache.dirty_bytes == 150
    cache.set_dirty(st, cs, 10)
    assert cache.dirty_bytes == 160
    cache.clear_dirty(st, 0)
    assert cache.dirty_bytes == 10
    cache.clear_dirty(st, 0)  # idempotent
    assert cache.dirty_bytes == 10
    other = cache.new_staging()
    cache.set_dirty(other, 0, 1000)
    assert cache.dirty_bytes == 1010
    cache.drop_staging(st)  # dropping a file forgets its dirty bytes
    assert cache.dirty_bytes == 1000 and st.dirty == {}
    assert not os.path.exists(st.path) and st.id not in cache.staging


def test_cache_release_and_drop_staging(cache: LocalCache) -> None:
    st = cache.new_staging()
    os.pwrite(st.fd, b"x" * 100, 0)
    st.extent = 100
    h = fake_hash(5)
    cache.add_staged_chunk(h, st, 0, 100)
    st.writers = 1
    cache.release_staging(st)  # still open for writing: nothing happens
    assert st.id in cache.staging and cache.has(h)
    st.writers = 0
    cache.release_staging(st)  # never published (deleted while open): dropped at once
    assert st.id not in cache.staging and not os.path.exists(st.path)
    assert st.fd == -1 and not cache.has(h) and cache.locate(h) is None
    cache.release_staging(st)  # again: harmless

    empty = staged(cache, b"")
    cache.release_staging(empty)  # published, but it serves no chunk: dropped
    assert empty.id not in cache.staging and not os.path.exists(empty.path)

    sealed = staged(cache, b"s" * 100)
    cache.add_staged_chunk(h, sealed, 0, 100)
    cache.release_staging(sealed)  # published and clean: kept, evictable
    assert sealed.id in cache.staging and os.path.exists(sealed.path)
    fd, off = cache.locate(h)  # type: ignore[misc]
    assert os.pread(fd, 100, off) == b"s" * 100


def test_cache_scan_at_startup(tmp_path: Path) -> None:
    root = tmp_path / "c"
    (root / "staging").mkdir(parents=True)
    for name in ("1", "2", "7", "junk"):
        (root / "staging" / name).write_bytes(b"z" * 10 * int(name if name.isdigit() else 1))
    h_old, h_new, h_bad = (codec.chunk_hash(c * 300) for c in (b"o", b"n", b"b"))
    for h, data in ((h_old, b"o" * 300), (h_new, b"n" * 300), (h_bad, b"b" * 299 + b"B")):
        (root / "chunks" / h[:2]).mkdir(parents=True, exist_ok=True)
        (root / "chunks" / h[:2] / h).write_bytes(data)
    (root / "chunks" / h_new[:2] / (h_new + ".tmp12345")).write_bytes(b"partial")
    os.utime(root / "chunks" / h_old[:2] / h_old, ns=(1_000_000_000, 1_000_000_000))
    os.utime(root / "chunks" / h_new[:2] / h_new, ns=(2_000_000_000, 2_000_000_000))
    os.utime(root / "chunks" / h_bad[:2] / h_bad, ns=(3_000_000_000, 3_000_000_000))

    def cached_files() -> list[str]:
        return sorted(p.name for p in (root / "chunks").rglob("*") if p.is_file())

    cache = LocalCache(str(root), limit_bytes=1 << 20)
    cache.scan(keep_staging={2, 9})
    try:
        assert sorted(os.listdir(root / "staging")) == ["2"]
        assert list(cache.staging) == [2]
        st = cache.staging[2]
        assert st.sealed and st.extent == 20 and os.pread(st.fd, 20, 0) == b"z" * 20
        assert cached_files() == sorted([h_old, h_new, h_bad])
        assert cache.cached_bytes == 900
        assert cache.new_staging().id == 8  # never reuses the id of a file seen on disk
        # nothing found on disk is served before it is re-hashed in this mount
        for h in (h_old, h_new, h_bad):
            assert cache.unverified(h) and not cache.has(h) and cache.locate(h) is None
        assert cache.verify_cached(h_new)
        assert not cache.unverified(h_new) and cache.has(h_new)
        fd, off = cache.locate(h_new)  # type: ignore[misc]
        assert os.pread(fd, 300, off) == b"n" * 300
        # a file whose bytes do not match its name is removed, never served
        assert not cache.verify_cached(h_bad)
        assert not cache.unverified(h_bad) and not cache.has(h_bad)
        assert cache.locate(h_bad) is None and cached_files() == sorted([h_old, h_new])
        assert cache.cached_bytes == 600
        # the least recently accessed (by atime) read-cache file is evicted first,
        # verified or not
        cache.limit_bytes = cache.used_bytes - 1
        cache.evict()
        assert not cache.unverified(h_old) and cached_files() == [h_new]
        assert cache.has(h_new)
    finally:
        cache.close()


def tree(top: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every path under `top` (itself included): mode, owner, and a file's bytes."""
    out = {}
    for p in [top, *top.rglob("*")]:
        st = p.lstat()
        out[str(p)] = (st.st_mode, st.st_uid, p.read_bytes() if p.is_file() else None)
    return out


def victim_dir(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    for name in ("1", "2", "a.bin"):
        (victim / name).write_bytes(b"not the cache's " + name.encode())
    (victim / "12").mkdir(mode=0o755)
    return victim


@pytest.mark.parametrize("name", ["staging", "chunks"])
def test_a_link_in_place_of_a_cache_directory_is_refused(tmp_path: Path, name: str) -> None:
    """staging/ or chunks/ a symbolic link (to a directory with files named as staging
    files): one line, and nothing in the directory it points to is opened or removed."""
    victim = victim_dir(tmp_path)
    before = tree(victim)
    root = tmp_path / "c"
    root.mkdir(mode=0o700)
    (root / name).symlink_to(victim)
    with pytest.raises(ConfigError) as refused:
        LocalCache(str(root), limit_bytes=1 << 20)
    what = "the staging directory" if name == "staging" else "the read cache directory"
    assert str(refused.value) == (
        f"{what} {root / name} is a symbolic link: remove it (ckptfs never follows a "
        f"link, nor uses another user's file, in its cache directory), or use another "
        f"--cache-dir")
    assert tree(victim) == before


def test_links_and_strangers_in_the_cache_are_never_followed(tmp_path: Path) -> None:
    """At startup a link in staging/ or chunks/ is removed, never what it points to; a
    journaled staging file that is a link is not used (its chunks are then missing);
    a new staging file is always one the cache makes (O_EXCL), never one found there."""
    victim = victim_dir(tmp_path)
    before = tree(victim)
    root = tmp_path / "c"
    (root / "staging").mkdir(parents=True)
    (root / "chunks").mkdir()
    (root / "staging" / "3").symlink_to(victim / "1")  # journaled: kept, if it were a file
    (root / "staging" / "4").symlink_to(victim / "2")  # not journaled: removed
    (root / "staging" / "5").mkdir()  # a directory: left alone
    (root / "chunks" / "12").symlink_to(victim / "12")  # a chunk directory
    h = "12" + "a" * 30  # a chunk of that directory, fetched later
    (root / "chunks" / "00").mkdir()
    (root / "chunks" / "00" / fake_hash(1)).symlink_to(victim / "a.bin")  # a chunk file
    cache = LocalCache(str(root), limit_bytes=1 << 20)
    try:
        cache.scan(keep_staging={3})
        assert cache.staging == {}
        assert sorted(os.listdir(root / "staging")) == ["5"]
        assert os.listdir(root / "chunks") == ["00"] and os.listdir(root / "chunks" / "00") == []
        assert cache.cached_bytes == 0
        planted = root / "staging" / "6"  # the next id, made meanwhile by someone else
        planted.write_bytes(b"")
        st = cache.new_staging()
        assert st.id == 7 and os.stat(st.path).st_mode & 0o777 == 0o600
        os.pwrite(st.fd, b"weights", 0)
        assert planted.read_bytes() == b""
        cache.put_fetched(h, b"chunk")  # chunks/12 is a directory of the cache's own now
        assert (root / "chunks" / h[:2]).is_dir() and not (root / "chunks" / h[:2]).is_symlink()
        assert (root / "chunks" / h[:2] / h).read_bytes() == b"chunk"
    finally:
        cache.close()
    assert tree(victim) == before


def test_a_read_from_memory_is_a_view_whose_buffer_is_not_reused_while_it_lives(
        tmp_path: Path) -> None:
    """A chunk decoded into a reused buffer is read as views (no copy in the FUSE thread);
    once read to the end it is dropped and its buffer given back, but a decode gets it
    again only when no view of it is alive: pyfuse3 copies from the view after read()
    returns, and a read over two chunks holds the first part across an await."""
    cache = LocalCache(str(tmp_path / "cache"), 1 << 30, memory_bytes=1 << 20)
    buf = cache.memory_buffer(1000)
    buf.array[:1000] = 7
    cache.put_in_memory(fake_hash(1), buf.array.data[:1000], buf)
    first = cache.read(fake_hash(1), 0, 600)
    last = cache.read(fake_hash(1), 600, 600)  # the end: dropped, its buffer given back
    assert isinstance(first, memoryview) and isinstance(last, memoryview)
    assert bytes(first) + bytes(last) == bytes([7]) * 1000
    assert cache.read(fake_hash(1), 0, 10) is None  # read once: no longer held
    other = cache.memory_buffer(1000)
    assert other is not buf  # `first` and `last` still view it
    other.array[:] = 9
    assert bytes(last) == bytes([7]) * 400
    del first, last
    assert cache.memory_buffer(1000) is buf  # no view left: reused
