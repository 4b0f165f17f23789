"""The node bundle's wheels (scripts/node/wheels.py): the node's own newer or equal
distributions are kept, the others unpacked for PYTHONPATH (the newest wheel of each),
executables into bin."""

from __future__ import annotations

import stat
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from node import wheels  # noqa: E402


def test_the_nodes_version_is_kept_unless_older() -> None:
    assert not wheels.needed("2.5.5", "2.5.5")
    assert not wheels.needed("0.35.0", "0.35.1")
    assert not wheels.needed("1.3.0.post0", "1.3.0")
    assert wheels.needed("2.10.0", "2.9.1")  # numbers, not text: 10 > 9
    assert wheels.needed("2.5.5", "1.26.4")
    assert wheels.needed("2.1.0", "2.0.9")
    assert wheels.needed("1.0", None)


def test_wheel_names_normalized_for_lookup() -> None:
    assert wheels.wheel_version("python_dateutil-2.9.0.post0-py2.py3-none-any.whl") == (
        "python-dateutil", "2.9.0.post0")
    assert wheels.wheel_version("py_spy-0.4.3-py2.py3-none-manylinux1_x86_64.whl") == (
        "py-spy", "0.4.3")
    with pytest.raises(ValueError, match="not a wheel file name"):
        wheels.wheel_version("pyfuse3-3.5.0.tar.gz")


def make_wheel(path: Path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


def test_missing_unpacked_present_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    src, site, bin_dir = tmp_path / "wheels", tmp_path / "site", tmp_path / "bin"
    src.mkdir()
    make_wheel(src / "ckptfs_absent_tool-0.4-py2.py3-none-manylinux1_x86_64.whl", {
        "ckptfs_absent_tool-0.4.dist-info/METADATA": b"Name: ckptfs-absent-tool\n",
        "ckptfs_absent_tool-0.4.data/scripts/absent-tool": b"\x7fELF"})
    make_wheel(src / "ckptfs_absent_dist-1.0-py3-none-any.whl", {
        "ckptfs_absent_dist/__init__.py": b"X = 1\n",
        "ckptfs_absent_dist-1.0.data/purelib/beside.py": b"",
        "ckptfs_absent_dist-1.0.dist-info/METADATA": b"Name: ckptfs-absent-dist\n"})
    make_wheel(src / "pytest-0.1-py3-none-any.whl", {"pytest/__init__.py": b"broken"})
    make_wheel(src / "ckptfs_absent_dist-0.9-py3-none-any.whl",  # an older download beside
               {"ckptfs_absent_dist/__init__.py": b"X = 0\n"})

    assert wheels.main([str(src), str(site), str(bin_dir)]) == 0

    assert (site / "ckptfs_absent_dist" / "__init__.py").read_bytes() == b"X = 1\n"
    assert (site / "beside.py").exists()
    assert (bin_dir / "absent-tool").read_bytes() == b"\x7fELF"  # (as py-spy's binary)
    assert (bin_dir / "absent-tool").stat().st_mode & stat.S_IXUSR
    assert not (site / "pytest").exists()  # this Python's own pytest is newer than 0.1
    out = capsys.readouterr().out
    assert "  ckptfs-absent-dist 1.0\n" in out and "0.9" not in out
    assert f"  pytest: the node's {pytest.__version__} (bundled 0.1)\n" in out
