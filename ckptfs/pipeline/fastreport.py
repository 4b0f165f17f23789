"""A fast tier's pending records as the store tools report them: how many, whose, readable."""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptfs.common.errors import FormatError, NotFoundError
from ckptfs.pipeline import fasttier
from ckptfs.store.base import Store
from ckptfs.tools.inspection import parallel_map


@dataclass
class PendingRecords:
    """The pending records of a fast tier: ops not yet applied to the object store."""

    records: int = 0
    queues: dict[str, int] = field(default_factory=dict)  # queue -> its records
    read: bool = False  # each record was read (else: counted from a listing)
    files: int = 0  # put_file records (when read)
    file_bytes: int = 0  # the sizes of the files they publish (when read)
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (key, why), when read

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"records": self.records, "queues": self.queues}
        if self.read:
            d.update(files=self.files, file_bytes=self.file_bytes,
                     damaged=[{"key": k, "detail": why} for k, why in self.damaged])
        return d


def pending_records(fast: Store, read: bool = False) -> PendingRecords:
    """The fast tier's pending records, from one listing of pending/; with `read`, each
    is read too (16 at a time): a damaged one is never moved, and stops trimming."""
    out = PendingRecords(read=read)
    keys = [k for k, _ in fast.list(fasttier.PENDING, delimiter=None).objects]
    for key in keys:
        queue = key[len(fasttier.PENDING):].partition("/")[0]
        out.queues[queue] = out.queues.get(queue, 0) + 1
    out.records = len(keys)
    if not read:
        return out

    def load(key: str) -> fasttier.Record | str | None:
        try:
            return fasttier.Record.from_json(fast.get_record(key))
        except NotFoundError:
            return None  # moved since the listing
        except FormatError as e:  # a BadObjectError too
            return str(e)

    for key, got in parallel_map(load, keys):
        if isinstance(got, str):
            out.damaged.append((key, got))
        elif got is not None and got.op.kind == "put_file":
            out.files += 1
            out.file_bytes += fasttier.record_file_bytes(got)
    out.damaged.sort()
    return out
