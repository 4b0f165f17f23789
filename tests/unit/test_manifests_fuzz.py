"""manifests: every record parser, fed mutated records, raises FormatError or returns a
record whose every field is in range (seeded, a few seconds in all)."""

from __future__ import annotations

import json
import random
import stat
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ckptfs.common.errors import FormatError
from ckptfs.format.chunking import MAX_CHUNK_SIZE
from ckptfs.format.manifests import (
    INT63,
    MODE_MAX,
    DirMarker,
    Manifest,
    RenameIntent,
    StoreInfo,
    check_path,
)
from ckptfs.store.base import ObjectInfo
from ckptfs.tools import trash

H1 = "0123456789abcdef" * 2
H2 = "f" * 32
#: valid records of each kind, the seeds of the mutations
VALID: dict[str, list[bytes]] = {
    "manifest": [
        Manifest(size=9, mode=0o100644, mtime_ns=1_796_031_424_855_709_800,
                 chunks=((H1, 4), (H2, 5)), chunk_size=65536, writer="gpu-node-07").to_json(),
        Manifest(size=0, mode=0o100600, mtime_ns=0, writer="w").to_json(),
        Manifest(size=11, mode=0o120777, mtime_ns=5, writer="w", target="step-1000/x").to_json(),
    ],
    "marker": [DirMarker(0o40700, 99).to_json(), b""],
    "info": [StoreInfo(chunk_size=65536, created_at=1.5).to_json(),
             StoreInfo(chunk_size=65536, format=1, chunking="fixed", codec="lz4").to_json()],
    "intent": [RenameIntent("ckpt/step-1.tmp", "ckpt/step-1", "gpu-node-07", 1.25).to_json()],
}
#: values that break a field's type or range
ODD: list[Any] = [
    True, False, None, -1, 0, 1, 2**16, 2**63, -2**63 - 1, 2**70, -2**70, 10**400, 1e308,
    -1e308, 1.5, float("nan"), float("inf"), float("-inf"), "", "x", "1", "\ud800", "a\0b",
    "../x", "/x", H1, H1.upper(), [], {}, [[]], [H1, 1], [H1, -1], [[H1, 2**70]],
    [["x" * 32, 1]], [[H1]], [[H1, 1, 2]], [[H1, True]], [[H1, 1.0]], {"a": 1},
]


def mutations(blob: bytes, rng: random.Random) -> Iterator[bytes]:
    """Records near `blob`: fields swapped for odd values, dropped or added; truncated;
    bytes flipped; non-UTF-8; deeply nested; not an object."""
    d: dict[str, Any] = json.loads(blob) if blob else {"v": 1}
    for _ in range(300):
        e = json.loads(json.dumps(d))
        for _ in range(rng.randint(1, 3)):
            key = rng.choice([*e, "extra"])
            how = rng.random()
            if how < 0.6:
                e[key] = rng.choice(ODD)
            elif how < 0.75:
                e.pop(key, None)
            elif isinstance(e.get(key), list) and e[key]:
                inner = e[key]
                j = rng.randrange(len(inner))
                if isinstance(inner[j], list) and inner[j]:
                    inner[j][rng.randrange(len(inner[j]))] = rng.choice(ODD)
                else:
                    inner[j] = rng.choice(ODD)
            else:
                e[key] = {"nested": [e.get(key)] * 2}
        yield json.dumps(e, allow_nan=True).encode()
    for _ in range(100):
        raw = bytearray(blob or b'{"v": 1}')
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        yield bytes(raw)
        yield bytes(raw[:rng.randrange(len(raw))])
    yield b"\xff\xfe" + blob
    yield blob.replace(b'"', b'"\xc3', 1)
    yield b"[" * 100_000 + b"]" * 100_000
    yield b'{"v": ' * 50_000
    yield b'{"v": 1, "size": ' + b"9" * 5000 + b"}"
    yield from (b"[]", b"null", b"42", b'"x"', b"true", b"1e999", b"NaN", b"{}", b"\x00")


def check_manifest(m: Manifest) -> None:
    assert 0 <= m.size < INT63 and -INT63 <= m.mtime_ns < INT63
    assert 0 <= m.mode <= MODE_MAX and (m.is_symlink or stat.S_ISREG(m.mode))
    if m.target is None:
        assert sum(n for _, n in m.chunks) == m.size
        assert all(len(h) == 32 and 0 <= n <= MAX_CHUNK_SIZE for h, n in m.chunks)
        assert m.chunk_offsets()[-1] == m.size
    else:
        assert not m.chunks and "\0" not in m.target and m.size == len(m.target.encode())
    m.writer.encode()
    assert Manifest.from_json(m.to_json()) == m


def check_marker(m: DirMarker) -> None:
    assert stat.S_ISDIR(m.mode) and -INT63 <= m.mtime_ns < INT63
    assert DirMarker.from_json(m.to_json()) == m


def check_info(info: StoreInfo) -> None:
    assert info.problem() is None and info.format in (1, 2)
    assert StoreInfo.from_json(info.to_json()) == info


def check_intent(i: RenameIntent) -> None:
    assert check_path(i.src) and check_path(i.dst) and i.src != i.dst
    assert RenameIntent.from_json(i.to_json()) == i


PARSERS: dict[str, tuple[Callable[[bytes], Any], Callable[[Any], None]]] = {
    "manifest": (Manifest.from_json, check_manifest),
    "marker": (DirMarker.from_json, check_marker),
    "info": (StoreInfo.from_json, check_info),
    "intent": (RenameIntent.from_json, check_intent),
}


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_mutated_records_give_format_errors_or_valid_records(kind: str) -> None:
    parse, check = PARSERS[kind]
    rng = random.Random(f"ckptfs-{kind}")
    rejected = accepted = 0
    for blob in VALID[kind]:
        check(parse(blob))
        for mutant in mutations(blob, rng):
            try:
                record = parse(mutant)
            except FormatError as e:
                assert "\n" not in str(e) and len(str(e)) < 400, str(e)
                rejected += 1
                continue
            check(record)
            accepted += 1
    assert rejected > 2 * accepted  # the mutations do reach the checks


@pytest.mark.parametrize(("field", "value"), [
    ("mode", -1), ("mode", 2**70), ("mode", MODE_MAX + 1), ("mode", True), ("mode", 420.0),
    ("size", -1), ("size", 2**63), ("size", 1e308), ("size", float("nan")), ("size", False),
    ("mtime_ns", 2**63), ("mtime_ns", -2**63 - 1), ("mtime_ns", "0"),
    ("chunks", [[H1, 1e308]]), ("chunks", [[H1, True], [H2, 8]]), ("chunks", [[H1, 9, 0]]),
    ("chunks", [[H1, MAX_CHUNK_SIZE + 1]]), ("chunks", [[H1.upper(), 9]]), ("chunks", {}),
    ("chunk_size", -5), ("chunk_size", "64k"), ("writer", 7), ("writer", "\ud800"),
    ("v", True), ("v", 0), ("v", "1"), ("v", 1.0),
])
def test_a_field_out_of_range_is_a_format_error(field: str, value: Any) -> None:
    d = json.loads(Manifest(size=9, mode=0o100644, mtime_ns=5,
                            chunks=((H1, 9),)).to_json())
    d[field] = value
    with pytest.raises(FormatError, match="manifest"):
        Manifest.from_json(json.dumps(d).encode())


def test_symlink_manifests_are_checked_too() -> None:
    good = json.loads(VALID["manifest"][2])
    change: dict[str, Any]
    for change in ({"size": 3}, {"target": "a\0b"}, {"target": 5}, {"chunks": []},
                   {"chunk_size": 65536}):
        with pytest.raises(FormatError, match="manifest"):
            Manifest.from_json(json.dumps({**good, **change}).encode())


def test_store_info_fields_are_checked() -> None:
    good = json.loads(VALID["info"][0])
    change: dict[str, Any]
    for change in ({"format": True}, {"format": 0}, {"format": 2.0}, {"chunk_size": 2**70},
                   {"chunk_size": 1e308}, {"chunk_size": True}, {"codec": 2},
                   {"chunking": None}, {"min_record": -1}, {"created_at": float("nan")},
                   {"created_by": []}, {"hash": 1}):
        with pytest.raises(FormatError, match="ckptfs.json|hash"):
            StoreInfo.from_json(json.dumps({**good, **change}).encode())
    with pytest.raises(FormatError, match="newer than this ckptfs supports"):
        StoreInfo.from_json(json.dumps({**good, "format": 3}).encode())


def test_rename_intents_are_checked() -> None:
    good = json.loads(VALID["intent"][0])
    change: dict[str, Any]
    for change in ({"op": "rename_file"}, {"src": "../x"}, {"dst": ""}, {"src": ""},
                   {"dst": good["src"]}, {"dst": good["src"] + "/in"},
                   {"src": good["dst"] + "/in"}, {"v": 2}, {"writer": 1}, {"time": "now"}):
        with pytest.raises(FormatError, match="rename intent"):
            RenameIntent.from_json(json.dumps({**good, **change}).encode())


def test_mutated_trash_keys_give_an_entry_or_none() -> None:
    """trash.parse reads a trash entry's key (its batch name and path): any key gives an
    entry whose path is safe, or None (outside the layout); never an exception."""
    rng = random.Random("ckptfs-trash")
    good = "trash/20261201T053300Z-24h-41-gpu-node-07/ckpt/step-1/model.pt"
    pieces = ["/", "//", "..", ".", "\0", "-", "9" * 400, "1e9d", "0s", "x", "\ud800", ""]
    for _ in range(3000):
        key = list(good)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(key))
            key[i:i + rng.randint(0, 3)] = rng.choice([*pieces, chr(rng.randrange(1, 0x3000))])
        entry = trash.parse(ObjectInfo("".join(key), 1, 1.0, "t"))
        if entry is not None:
            assert entry.path and check_path(entry.path) == entry.path
            assert entry.keep >= 0 and entry.expires >= entry.deleted
