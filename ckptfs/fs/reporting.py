"""What a mount reports about itself: file states, statistics, problems, durability.

A mixin of CheckpointFS (fs.filesystem), which provides the attributes declared here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from ckptfs.common.errors import NoAttribute, NotSupported
from ckptfs.common.retry import retry_counts
from ckptfs.fs.names import NAME_MAX
from ckptfs.fs.namespace import ROOT_INODE, FileNode, InodeTable, Node
from ckptfs.fs.options import Options
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fetcher import Fetcher
from ckptfs.pipeline.publisher import Publisher
from ckptfs.pipeline.recovery import JournalCheck
from ckptfs.pipeline.uploader import Uploader

STATE_XATTR = "user.ckptfs.state"
CONTROL_XATTR = "user.ckptfs.control"


@dataclass(frozen=True)
class MountStatistics:
    """What `ckptfs status --json` prints (docs/OPERATIONS.md explains each field)."""

    written_bytes: int
    dirty_bytes: int
    uploading_bytes: int
    uploaded_bytes: int
    stored_bytes: int
    dedup_bytes: int
    logical_bytes: int
    compression_ratio: float | None
    dedup_ratio: float | None
    cache_bytes: int
    cache_limit: int
    memory_bytes: int  # fetched chunks held in memory (--read-memory)
    upload_rate: int
    eta_seconds: float | None
    pending_chunks: int
    pending_ops: int
    open_files: int
    fetched_bytes: int
    cache_hits: int
    cache_misses: int
    errors: list[str]
    problems: list[str]
    retrying_since: float | None
    retries: dict[str, int]  # tries made again, by what (retry.RETRIES; per process)
    #: why the journal cannot vouch for what is pending, until its check has run
    journal_damage: str | None
    durable: bool


class Reporting:
    """The whole-mount queries of CheckpointFS: `ckptfs status`, `sync`, the final flush."""

    cache: LocalCache
    uploader: Uploader
    fetcher: Fetcher
    publisher: Publisher
    table: InodeTable
    journal_check: JournalCheck | None
    published_bytes: int
    written_bytes: int
    opt: Options

    if TYPE_CHECKING:
        def node(self, inode: int) -> Node: ...

    def xattr(self, inode: int, name: str) -> bytes:
        node = self.node(inode)
        if name == STATE_XATTR and isinstance(node, FileNode):
            return self.file_state(node).encode()
        if name == CONTROL_XATTR and inode == ROOT_INODE:
            return self.opt.control_socket.encode()
        raise NoAttribute(name)

    def file_state(self, node: FileNode) -> str:
        """'open' (written, not yet closed), 'pending' (closed, chunks uploading),
        'durable' (every chunk in the store), or 'remote' (written by another node)."""
        if node.buffer is not None:
            return "open"
        m = node.manifest
        if not node.removed and self.publisher.is_pending(node.path):
            return "pending"  # its manifest is not in the store yet
        if m is None or m.is_symlink:
            return "durable"
        hashes = [h for h, _ in m.chunks]
        if all(h in self.uploader.in_store for h in hashes):
            return "durable"
        if any(self.uploader.is_pending(h) for h in hashes):
            return "pending"
        return "remote"

    @staticmethod
    def set_xattr(name: str) -> None:
        raise NotSupported(name)

    def statfs(self) -> dict[str, int]:
        """Sizes of the cache directory's disk, where every write lands first: `df` on the
        mount shows how much can still be written locally. Inodes are not limited."""
        disk = os.statvfs(self.cache.root)
        return {"bsize": disk.f_frsize, "blocks": disk.f_blocks, "bfree": disk.f_bfree,
                "bavail": disk.f_bavail, "files": 1 << 32, "ffree": 1 << 32,
                "namemax": NAME_MAX}

    def files_in_flight(self, limit: int = 20) -> list[dict[str, object]]:
        """The files this mount is still saving, for `status --watch`: those open with
        written data and those closed whose chunks are still uploading, largest first, at
        most `limit`; `left_bytes`: how much of each is not in the store yet."""
        pending = self.uploader.pending_hashes()
        out: list[dict[str, object]] = []
        for n in self.table.nodes.values():
            if not isinstance(n, FileNode) or n.removed:
                continue
            if n.buffer is not None:
                out.append({"path": n.path, "state": "open", "size": n.current_size,
                            "left_bytes": sum(n.buffer.staging.dirty.values())})
            elif pending and n.manifest is not None and not n.manifest.is_symlink:
                left = sum(size for h, size in n.manifest.chunks if h in pending)
                if left:
                    out.append({"path": n.path, "state": "pending", "size": n.size,
                                "left_bytes": left})
        out.sort(key=lambda f: -int(str(f["size"])))
        return out[:limit]

    def open_buffers(self) -> int:
        """Files with written data not yet published (open, or failed to publish)."""
        return len(self.table.open_buffers())

    def problems(self) -> list[str]:
        """Data this mount could not save, one line each (status `errors`, the log)."""
        check = self.journal_check.problem() if self.journal_check is not None else None
        out = [check] if check is not None else []
        out += [f"could not publish {n.path}; its data is not saved: {n.publish_error}"
                for n in self.table.open_buffers() if n.publish_error]
        out += [f"DATA LOST: {f.path}: chunk {f.hash} is not in the store: {f.reason}; "
                f"rewrite or delete the file" for f in self.uploader.lost_files()]
        return out

    def statistics(self) -> MountStatistics:
        up = self.uploader.statistics()
        fetch = self.fetcher.statistics()
        problems = self.problems()
        errors = [e for e in (up.last_error, self.publisher.last_error) if e] + problems
        rate = up.upload_rate
        dirty = self.cache.dirty_bytes
        open_files = self.open_buffers()
        return MountStatistics(
            written_bytes=self.written_bytes,
            dirty_bytes=dirty,
            uploading_bytes=up.uploading_bytes,
            uploaded_bytes=up.uploaded_bytes,
            stored_bytes=up.stored_bytes,
            dedup_bytes=up.dedup_bytes,
            logical_bytes=self.published_bytes,
            compression_ratio=round(up.uploaded_bytes / up.stored_bytes, 3)
            if up.stored_bytes else None,
            dedup_ratio=round((up.uploaded_bytes + up.dedup_bytes) / up.uploaded_bytes, 3)
            if up.uploaded_bytes else None,
            cache_bytes=self.cache.used_bytes,
            cache_limit=self.cache.limit_bytes,
            memory_bytes=self.cache.memory_bytes,
            upload_rate=round(rate),
            eta_seconds=round(dirty / rate, 1) if rate > 0 else None,
            pending_chunks=self.uploader.pending_count(),
            pending_ops=self.publisher.pending_count,
            open_files=open_files,
            fetched_bytes=fetch.fetched_bytes,
            cache_hits=fetch.cache_hits,
            cache_misses=fetch.cache_misses,
            errors=errors,
            problems=problems,
            retrying_since=up.retrying_since,
            retries=retry_counts(),
            journal_damage=None if self.checked() or self.journal_check is None
            else self.journal_check.damage,
            durable=self.flushed() and not open_files and not problems,
        )

    def checked(self) -> bool:
        """No check of a damaged journal against the store is due (recovery.py)."""
        return self.journal_check is None or self.journal_check.done

    def flushed(self) -> bool:
        """Every chunk and metadata change journaled so far is in the store (and the
        journal can vouch for that: checked())."""
        return (self.uploader.pending_count() == 0 and self.publisher.pending_count == 0
                and self.checked())

    def durable(self) -> bool:
        """flushed(), no file open with unpublished data (a failed publish included), and
        no data lost."""
        return (self.flushed() and not self.table.open_buffers()
                and not self.uploader.lost_files())

    def sync_target(self) -> tuple[int, frozenset[str]]:
        """What `ckptfs sync` waits for: the ops and chunks journaled so far."""
        return self.publisher.last_seq, frozenset(self.uploader.pending_hashes())

    def reached(self, target: tuple[int, frozenset[str]]) -> bool:
        seq, hashes = target
        return self.checked() and self.publisher.applied_seq >= seq and not any(
            self.uploader.is_pending(h) for h in hashes)

    async def wait_all_flushed(self) -> None:
        """Until every closed file and metadata change is in the store."""
        while not self.flushed():
            with trio.move_on_after(0.5):
                await self.uploader.wait_changed()
