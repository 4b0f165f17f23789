"""formats: format-aware cuts on real torch, .distcp and safetensors files, streamed or whole."""

from __future__ import annotations

import hashlib
import io
import random
import struct
import warnings
import zipfile
import zlib
from pathlib import Path

import pytest
import safetensors.torch
import torch
from torch.distributed.checkpoint import state_dict_saver

from ckptfs.format.formats import FixedCutter, new_cutter

MX = 64 * 1024  # chunk size
MN = 4 * 1024  # min record


def cuts_of(data: bytes, steps: list[int] | None = None, aware: bool = True) -> list[int]:
    """All cuts of `data` fed as a whole, or growing by `steps`; only cuts < its size."""
    cutter = new_cutter(MX, MN, aware)

    def read(offset: int, length: int) -> bytes:
        assert 0 <= offset and offset + length <= available
        return data[offset : offset + length]

    cuts: list[int] = []
    available = 0
    for step in [*(steps or []), len(data)]:
        available = min(len(data), available + step)
        new = cutter.feed(read, available)
        assert new == sorted(new) and all(0 < c <= available for c in new)
        assert not cuts or not new or new[0] > cuts[-1]
        cuts += new
    return [c for c in cuts if c < len(data)]


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def digests(data: bytes, cuts: list[int]) -> set[str]:
    return {hashlib.sha256(c).hexdigest() for c in chunks(data, cuts)}


def model_state() -> dict[str, object]:
    """A model state dict and its Adam optimizer state: fp32 and bf16, small and large tensors."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(300, 200), torch.nn.Linear(200, 10), torch.nn.Linear(10, 3)
    )
    model[1].to(torch.bfloat16)
    optimizer = torch.optim.Adam(model.parameters())
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def tensors(state: object) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in tensors(v)]
    return []


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def saved(path: Path, state: object) -> bytes:
    torch.save(state, path)
    return path.read_bytes()


def assert_aligned(data: bytes, cuts: list[int], state: object) -> None:
    """Every tensor of at least MN bytes starts and ends a chunk; no chunk exceeds MX."""
    assert all(len(c) <= MX for c in chunks(data, cuts))
    large = [tensor_bytes(t) for t in tensors(state) if t.nbytes >= MN]
    assert large
    for raw in large:
        start = data.find(raw)
        assert start >= 0 and start in cuts and start + len(raw) in [*cuts, len(data)]


def random_steps(rng: random.Random, size: int) -> list[int]:
    """Growth steps: 1-byte steps first, then random sizes up to a few chunks."""
    steps = [1] * rng.randrange(40)
    while sum(steps) < size:
        steps.append(rng.choice([1, 7, 30, 511, 4096, MX - 1, MX, 3 * MX + 5]))
    return steps


def test_torch_save_tensors_get_their_own_chunks(tmp_path: Path) -> None:
    state = model_state()
    data = saved(tmp_path / "step_100.pt", state)
    assert_aligned(data, cuts_of(data), state)


def test_torch_zip_bytes_use_data_descriptors(tmp_path: Path) -> None:
    """What the parser relies on: sizes 0 in local headers, data 64-byte aligned."""
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(100)}, path)
    for info in zipfile.ZipFile(path).infolist():
        assert info.flag_bits & 0x08
        header = path.read_bytes()[info.header_offset : info.header_offset + 30]
        assert header[18:26] == bytes(8)


def test_same_tensors_same_chunks_under_other_names(tmp_path: Path) -> None:
    state = model_state()
    renamed = {"run2." + k: v for k, v in state.items()}
    a = saved(tmp_path / "a.pt", state)
    b = saved(tmp_path / "checkpoint-step-200-rank-3.pt", renamed)
    tensor_chunks = {
        hashlib.sha256(piece).hexdigest()
        for t in tensors(state) if t.nbytes >= MN
        for piece in chunks(tensor_bytes(t), list(range(MX, t.nbytes, MX)))
    }
    assert len(tensor_chunks) > 3
    assert tensor_chunks <= digests(a, cuts_of(a))
    assert tensor_chunks <= digests(b, cuts_of(b))


def test_large_tensor_is_split_from_its_start(tmp_path: Path) -> None:
    weight = torch.randn(100_000)  # 400 000 bytes: 6 full chunks and a rest
    data = saved(tmp_path / "big.pt", {"w": weight})
    start = data.find(tensor_bytes(weight))
    cuts = cuts_of(data)
    inside = [c for c in cuts if start <= c <= start + weight.nbytes]
    assert inside == [*range(start, start + weight.nbytes, MX), start + weight.nbytes]


def test_streaming_equals_whole(tmp_path: Path) -> None:
    rng = random.Random(1)
    state = model_state()
    files = [
        saved(tmp_path / "m.pt", state),
        saved(tmp_path / "big.pt", {"w": torch.randn(50_000), "b": torch.randn(3)}),
        safetensors_bytes(tmp_path),
        distcp_bytes(tmp_path),
        long_headers_zip(),
        rng.randbytes(300_000),
    ]
    for data in files:
        whole = cuts_of(data)
        for _ in range(15):
            assert cuts_of(data, random_steps(rng, len(data))) == whole


def long_headers_zip() -> bytes:
    """Local headers longer than a chunk (names and extra fields of ~64 KiB), small data."""
    stream = io.BytesIO()
    with zipfile.ZipFile(stream, "w") as archive:
        for i in range(3):
            info = zipfile.ZipInfo(f"{i}" * 60_000)
            info.extra = (0xCAFE).to_bytes(2, "little") + (60_000).to_bytes(2, "little")
            info.extra += bytes(60_000)
            archive.writestr(info, b"small" * (i + 1) + bytes(2000 * i))
    return stream.getvalue()


def safetensors_bytes(tmp_path: Path) -> bytes:
    tensors_ = {
        "embed": torch.randn(40_000),
        "norm": torch.ones(10, dtype=torch.bfloat16),
        "proj": torch.randn(100, 50).to(torch.bfloat16),
    }
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(tensors_, path, metadata={"step": "7"})
    return path.read_bytes()


def test_safetensors(tmp_path: Path) -> None:
    data = safetensors_bytes(tmp_path)
    state = safetensors.torch.load(data)
    assert_aligned(data, cuts_of(data), state)


def test_malformed_safetensors_header_is_cut_fixed() -> None:
    header = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}'
    data = len(header).to_bytes(8, "little") + header + bytes(200_000)
    assert cuts_of(data) == list(range(MX, len(data), MX))


def distcp_bytes(tmp_path: Path) -> bytes:
    state = {"model": model_state()["model"], "extra": io.BytesIO(b"raw bytes item")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # single process, no process group
        state_dict_saver.save(state, checkpoint_id=tmp_path / "dcp")
    (path,) = (tmp_path / "dcp").glob("*.distcp")
    return path.read_bytes()


def test_distcp_concatenated_archives(tmp_path: Path) -> None:
    data = distcp_bytes(tmp_path)
    assert data.count(b"PK\x05\x06") > 1
    assert_aligned(data, cuts_of(data), model_state()["model"])


def test_unknown_format_is_cut_fixed() -> None:
    data = random.Random(2).randbytes(5 * MX + 17)
    fixed = list(range(MX, len(data), MX))
    assert cuts_of(data) == fixed
    assert cuts_of(data, aware=False) == fixed


def test_fixed_cutter_waits_for_whole_chunks() -> None:
    cutter = FixedCutter(MX)
    read = lambda offset, length: bytes(length)  # noqa: E731
    assert cutter.feed(read, MX - 1) == []
    assert cutter.feed(read, MX) == [MX]
    assert cutter.feed(read, MX) == []
    assert cutter.feed(read, 4 * MX + 1) == [2 * MX, 3 * MX, 4 * MX]


@pytest.mark.parametrize("keep", [100, 700, 30_000, -50])
def test_truncated_or_garbage_after_header_falls_back(tmp_path: Path, keep: int) -> None:
    rng = random.Random(keep)
    data = saved(tmp_path / "m.pt", {"w": torch.randn(30_000)})
    data = data[:keep] + rng.randbytes(300_000)
    cuts = cuts_of(data)
    assert all(len(c) <= MX for c in chunks(data, cuts))
    assert cuts_of(data, random_steps(rng, len(data))) == cuts


def zip64_archive(entries: list[tuple[str, bytes]]) -> bytes:
    """A stored (uncompressed) zip archive, built byte by byte, whose local and central
    headers say 0xFFFFFFFF for both sizes and give them in a zip64 extra field, as for
    records > 4 GiB (what `zipfile` writes there depends on the CPython release)."""
    local, central = bytearray(), bytearray()
    for name, data in entries:
        raw_name, crc, size = name.encode(), zlib.crc32(data), len(data)
        extra = struct.pack("<HHQQ", 0x0001, 16, size, size)  # uncompressed, compressed
        # (the central header's field adds the local header's offset)
        central_extra = struct.pack("<HHQQQ", 0x0001, 24, size, size, len(local))
        central += struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 45, 45, 0, 0, 0, 0, crc,
                               0xFFFFFFFF, 0xFFFFFFFF, len(raw_name), len(central_extra),
                               0, 0, 0, 0, 0xFFFFFFFF) + raw_name + central_extra
        local += struct.pack("<4s5H3I2H", b"PK\x03\x04", 45, 0, 0, 0, 0, crc,
                             0xFFFFFFFF, 0xFFFFFFFF, len(raw_name), len(extra))
        local += raw_name + extra + data
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, len(entries), len(entries),
                      len(central), len(local), 0)
    return bytes(local + central + end)


def test_zip64_local_header_sizes() -> None:
    """Sizes in a zip64 extra field (0xFFFFFFFF in the header), as for records > 4 GiB."""
    payload = random.Random(3).randbytes(100_000)
    data = zip64_archive([("small", b"x" * 10), ("big", payload)])
    with zipfile.ZipFile(io.BytesIO(data)) as archive:  # a valid archive, zipfile agrees
        assert archive.read("small") == b"x" * 10 and archive.read("big") == payload
    assert data[18:26] == b"\xff" * 8
    start = data.find(payload)
    assert data[start - 20:start - 16] == struct.pack("<HH", 0x0001, 16)  # the extra field
    cuts = cuts_of(data)
    assert [c for c in cuts if c >= start] == [start, start + MX, start + len(payload)]


def test_streamed_zip_of_unknown_sizes_falls_back() -> None:
    """Data descriptors and no torch pickle: the entry's end is not found, cuts are fixed."""

    class Unseekable(io.RawIOBase):
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b: bytes) -> int:  # type: ignore[override]
            self.data += b
            return len(b)

    stream = Unseekable()
    with zipfile.ZipFile(stream, "w") as archive:
        archive.writestr("big", random.Random(4).randbytes(200_000))
    data = bytes(stream.data)
    assert cuts_of(data) == list(range(MX, len(data), MX))
