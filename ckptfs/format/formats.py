"""Format-aware chunk boundaries: every tensor's bytes get chunks of their own.

A Cutter watches a file's bytes stream in and returns chunk boundaries ("cuts") as soon as
they are certain. Records (a tensor's data) of at least `min_record` bytes are cut at their
start and end, so the same tensor bytes give the same chunks whatever the file name, step,
rank or dictionary key; headers and small records are merged into "glue" chunks of at least
`min_record` bytes. No chunk exceeds `chunk_size`. Cuts depend on the bytes only, never on
how they arrived: whatever the parser does not understand is cut at fixed steps.

Formats: torch zip archives (torch.save, and torch.distributed.checkpoint .distcp files,
which concatenate such archives) and safetensors. torch writes each entry with a data
descriptor (general purpose flag bit 3, sizes 0 in the local header), so a storage's size
comes from the archive's data.pkl, written first; the end of a metadata entry (data.pkl,
version, ...) is found by looking for its data descriptor within `chunk_size` bytes.
"""

from __future__ import annotations

import json
import pickletools
import struct
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import NamedTuple, Protocol

Read = Callable[[int, int], bytes]


class Cutter(Protocol):
    def feed(self, read: Read, available: int) -> list[int]:
        """New cut offsets c, ascending, each greater than every cut returned before and
        0 < c <= available. Bytes [0, available) of the file exist and may be read with read();
        `available` never decreases between calls. A cut c means a chunk boundary at offset c."""
        ...


def new_cutter(chunk_size: int, min_record: int, aware: bool) -> Cutter:
    """A FixedCutter, or (aware) a cutter that detects the format from the first bytes."""
    if not 0 <= min_record <= chunk_size:
        raise ValueError("need 0 <= min_record <= chunk_size")
    return AwareCutter(chunk_size, min_record) if aware else FixedCutter(chunk_size)


class _Cuts:
    """The cut rules: records in, cuts out once `available` reaches them."""

    def __init__(self, chunk_size: int, min_record: int) -> None:
        if chunk_size <= 0:
            raise ValueError("chunk size must be positive")
        self._max = chunk_size
        self._min = min_record
        self._released = 0  # the last cut returned
        self._decided = 0  # the last cut decided by a record (forced cuts do not move it)
        self._queue: deque[int] = deque()  # decided, not yet returned

    def record(self, start: int, end: int) -> None:
        """A record of data [start, end): chunks of its own if large, else glue."""
        if end - start >= self._min:
            self._decide(start)
            self._decide(end)
        else:
            self.glue(end)

    def glue(self, end: int) -> None:
        """Headers or a small record up to `end`: cut there once the glue is long enough."""
        if end - self._decided >= self._min:
            self._decide(end)

    def _decide(self, cut: int) -> None:
        if cut > self._decided:
            self._queue.append(cut)
            self._decided = cut

    def release(self, available: int, floor: int) -> list[int]:
        """Cuts up to `available`; fixed steps past the last cut only up to `floor`.

        `floor` bounds every cut records may still decide from below: a fixed step at or
        below it is one the cut rules would make anyway (the chunk would exceed the maximum).
        """
        cuts: list[int] = []
        while True:
            step = self._released + self._max
            if self._queue and self._queue[0] <= step:
                cut, limit = self._queue[0], available
            else:
                cut, limit = step, available if self._queue else floor
            if cut > limit:
                return cuts
            if self._queue and cut == self._queue[0]:
                self._queue.popleft()
            cuts.append(cut)
            self._released = cut


class FixedCutter:
    """Cuts at every multiple of chunk_size."""

    def __init__(self, chunk_size: int) -> None:
        self._cuts = _Cuts(chunk_size, chunk_size)

    def feed(self, read: Read, available: int) -> list[int]:
        return self._cuts.release(available, available)


class _Need(NamedTuple):
    """A parser's request: bytes [offset, offset + length); no record cut falls below floor."""

    offset: int
    length: int
    floor: int


# A parser asks for bytes (yield _Need, receives them) and reports records to a _Cuts;
# when it returns, the rest of the file gets fixed cuts.
_Parser = Generator[_Need, bytes, None]


def _header(offset: int, length: int) -> _Need:
    """Header bytes: record data only follows them."""
    return _Need(offset, length, offset + length)


class AwareCutter:
    """Cuts at the records of the format detected from the first bytes, else fixed."""

    def __init__(self, chunk_size: int, min_record: int) -> None:
        self._cuts = _Cuts(chunk_size, min_record)
        self._parser = _detect(self._cuts, chunk_size)
        self._need: _Need | None = next(self._parser)

    def feed(self, read: Read, available: int) -> list[int]:
        while self._need is not None and self._need.offset + self._need.length <= available:
            try:
                self._need = self._parser.send(read(self._need.offset, self._need.length))
            except StopIteration:
                self._need = None
        floor = available if self._need is None else min(available, self._need.floor)
        return self._cuts.release(available, floor)


_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_LOCAL = b"PK\x03\x04"
_DESCRIPTOR = b"PK\x07\x08"
_CENTRAL = b"PK\x01\x02"
_END = b"PK\x05\x06"
_ZIP64_END = b"PK\x06\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EXTRA = 0x0001
_UNKNOWN_32 = 0xFFFFFFFF
_HAS_DESCRIPTOR = 0x0008

_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
_SCAN_WINDOW = 512  # small: a scan window must not run past the end of the file


def _detect(cuts: _Cuts, chunk_size: int) -> _Parser:
    """Zip archive, safetensors, or nothing (fixed cuts)."""
    head = yield _header(0, 9)
    if head.startswith(_LOCAL):
        yield from _zip(cuts, chunk_size)
        return
    header_size = _U64.unpack_from(head)[0]
    if 2 <= header_size <= _SAFETENSORS_MAX_HEADER and head[8:9] == b"{":
        yield from _safetensors(cuts, header_size)


def _safetensors(cuts: _Cuts, header_size: int) -> _Parser:
    """One record per tensor, from the JSON header; malformed: no records."""
    header = yield _header(8, header_size)
    base = 8 + header_size
    for begin, end in _safetensors_spans(header):
        cuts.record(base + begin, base + end)


def _safetensors_spans(header: bytes) -> list[tuple[int, int]]:
    """The tensors' data_offsets in order, or [] if the header is malformed."""
    try:
        entries = json.loads(header)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError included
        return []
    if not isinstance(entries, dict):
        return []
    spans = []
    for name, entry in entries.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            return []
        spans.append((offsets[0], offsets[1]))
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:], strict=False)):
        return []
    return spans


def _zip(cuts: _Cuts, chunk_size: int) -> _Parser:
    """Walk zip records from offset 0: archives, one after another, until something else."""
    pos = 0
    sizes: dict[str, int] = {}  # torch storage entry name -> byte size, from data.pkl
    ended = False  # after an end of central directory, only a new archive may follow
    while True:
        signature = yield _header(pos, 4)
        if signature == _LOCAL:
            ended = False
            entry_end = yield from _local_entry(cuts, pos, sizes, chunk_size)
            if entry_end is None:
                return
            pos = entry_end
        elif signature in _SKIPPED and not ended:
            length = yield from _skipped_length(pos, signature)
            pos += length
            ended = signature == _END
        else:
            return


# signature -> (fixed length, offsets of the u16 lengths of the variable parts)
_SKIPPED = {
    _CENTRAL: (46, (28, 30, 32)),
    _ZIP64_LOCATOR: (20, ()),
    _END: (22, (20,)),
    _ZIP64_END: (12, ()),
}


def _skipped_length(pos: int, signature: bytes) -> Generator[_Need, bytes, int]:
    """Length of a central directory entry or end record."""
    fixed, length_offsets = _SKIPPED[signature]
    head = yield _header(pos, fixed)
    if signature == _ZIP64_END:
        return fixed + int(_U64.unpack_from(head, 4)[0])
    return fixed + sum(int(_U16.unpack_from(head, o)[0]) for o in length_offsets)


def _local_entry(
    cuts: _Cuts, pos: int, sizes: dict[str, int], chunk_size: int
) -> Generator[_Need, bytes, int | None]:
    """Report the entry's data at `pos`; its end (descriptor included), None if unknown."""
    head = yield _header(pos, 30)
    flags = _U16.unpack_from(head, 6)[0]
    size, usize = _U32.unpack_from(head, 18)[0], _U32.unpack_from(head, 22)[0]
    name_length, extra_length = _U16.unpack_from(head, 26)[0], _U16.unpack_from(head, 28)[0]
    tail = yield _header(pos + 30, name_length + extra_length)
    name = tail[:name_length].decode("utf-8", "replace")
    zip64 = _zip64_field(tail[name_length:])
    if size == _UNKNOWN_32 and zip64 is not None:
        size = _zip64_size(zip64, usize == _UNKNOWN_32)
    start = pos + 30 + name_length + extra_length
    descriptor = (24 if zip64 is not None else 16) if flags & _HAS_DESCRIPTOR else 0
    if size == 0 and descriptor and name not in sizes:
        end = yield from _scan_descriptor(start, descriptor, chunk_size)
        if end is None:
            return None
        cuts.glue(end)
    else:
        end = start + (sizes[name] if size == 0 and descriptor else size)
        cuts.record(start, end)
        if descriptor:
            found = yield _header(end, descriptor)
            if _descriptor_size(found) != end - start:
                return None
    if name.endswith("data.pkl"):
        pickle = yield _header(start, end - start)
        sizes.update(_storage_sizes(pickle, name.removesuffix("data.pkl")))
    return end + descriptor


def _zip64_field(extra: bytes) -> bytes | None:
    """The data of the zip64 extended information extra field, if any."""
    at = 0
    while at + 4 <= len(extra):
        field, length = _U16.unpack_from(extra, at)[0], _U16.unpack_from(extra, at + 2)[0]
        if field == _ZIP64_EXTRA:
            return extra[at + 4 : at + 4 + length]
        at += 4 + length
    return None


def _zip64_size(field: bytes, has_usize: bool) -> int:
    """The compressed size in a local header's zip64 field (after the uncompressed one)."""
    at = 8 if has_usize else 0
    return int(_U64.unpack_from(field, at)[0]) if at + 8 <= len(field) else 0


def _descriptor_size(descriptor: bytes) -> int | None:
    """The compressed size a data descriptor (16 bytes, or 24 for zip64) records."""
    if not descriptor.startswith(_DESCRIPTOR):
        return None
    unpack = _U64 if len(descriptor) == 24 else _U32
    return int(unpack.unpack_from(descriptor, 8)[0])


def _scan_descriptor(
    start: int, width: int, limit: int
) -> Generator[_Need, bytes, int | None]:
    """End of data starting at `start`: the first descriptor at q recording size q - start.

    Only looks `limit` bytes far (entries of unknown size are metadata, not tensors).
    """
    at = start
    while at - start < limit:
        window = yield _Need(at, _SCAN_WINDOW, at)  # the end lies at or after `at`
        found = window.find(_DESCRIPTOR)
        while 0 <= found <= _SCAN_WINDOW - width:
            if _descriptor_size(window[found : found + width]) == at + found - start:
                return at + found
            found = window.find(_DESCRIPTOR, found + 1)
        at += _SCAN_WINDOW - width + 1
    return None


# bytes per element of torch's pickled storage classes (torch.FloatStorage, ...)
_ELEMENT_SIZES = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
    "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1,
    "BoolStorage": 1, "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8,
    "QInt8Storage": 1, "QUInt8Storage": 1, "QInt32Storage": 4, "QUInt4x2Storage": 1,
    "QUInt2x4Storage": 1, "UntypedStorage": 1,
}


class _Global(str):
    """A pickled global reference, "module name"."""


_MARK = object()


def _storage_sizes(pickle: bytes, prefix: str) -> dict[str, int]:
    """Entry name -> byte size of each storage a torch data.pkl refers to ({} if malformed)."""
    try:
        return dict(_persistent_storages(pickle, prefix))
    except Exception:  # any malformed pickle: its storages get no known size
        return {}


def _persistent_storages(pickle: bytes, prefix: str) -> Iterator[tuple[str, int]]:
    """Walk the pickle's opcodes without running it; yield each storage's name and size."""
    stack: list[object] = []
    memo: dict[object, object] = {}
    for opcode, arg, _ in pickletools.genops(pickle):
        if opcode.name == "MARK":
            stack.append(_MARK)
        elif opcode.name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = stack[-1]
        elif opcode.name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif opcode.name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[arg])
        elif opcode.name == "GLOBAL":
            stack.append(_Global(arg))
        elif opcode.name == "STACK_GLOBAL":
            name, module = stack.pop(), stack.pop()
            stack.append(_Global(f"{module} {name}"))
        elif opcode.name == "BINPERSID":
            storage = _storage(stack.pop(), prefix)
            if storage is not None:
                yield storage
            stack.append(None)
        elif opcode.name in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE"):
            count = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "EMPTY_TUPLE": 0}.get(opcode.name)
            stack.append(tuple(_pop_items(stack, count)))
        elif isinstance(arg, str | int) and not opcode.stack_before and opcode.stack_after:
            stack.append(arg)
        else:
            _opaque(opcode, stack)


def _pop_items(stack: list[object], count: int | None) -> list[object]:
    """The top `count` items, or (None) the items above the topmost mark, which goes too."""
    if count is None:
        at = len(stack) - 1 - stack[::-1].index(_MARK)
        items, stack[at:] = stack[at + 1 :], []
    else:
        items, stack[len(stack) - count :] = stack[len(stack) - count :], []
    return items


def _opaque(opcode: pickletools.OpcodeInfo, stack: list[object]) -> None:
    """Any other opcode: pop what it consumes, push placeholders for what it produces."""
    before = opcode.stack_before
    if pickletools.markobject in before:
        _pop_items(stack, None)
        _pop_items(stack, before.index(pickletools.markobject))
    else:
        _pop_items(stack, len(before))
    stack.extend(None for _ in opcode.stack_after)


def _storage(pid: object, prefix: str) -> tuple[str, int] | None:
    """("<prefix>data/<key>", bytes) of a persistent id ("storage", type, key, location, numel)."""
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
        return None
    storage_type, key, numel = pid[1], pid[2], pid[4]
    if not (isinstance(storage_type, _Global) and isinstance(key, str)
            and type(numel) is int):
        return None
    element_size = _ELEMENT_SIZES.get(storage_type.rpartition(" ")[2])
    if element_size is None:
        return None
    return f"{prefix}data/{key}", numel * element_size
