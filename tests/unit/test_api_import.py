"""`import ckptfs` (and the Python API on first use) in a fresh interpreter stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
HEAVY = ["pyfuse3", "trio", "boto3", "numpy", "zstandard"]


def loaded_after(code: str) -> list[str]:
    """The HEAVY modules loaded after running `code` in a new interpreter."""
    r = subprocess.run([sys.executable, "-c", f"import json, sys\n{code}\n"
                        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"],
                       capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(CHECKOUT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout))


def test_import_ckptfs_imports_no_heavy_library() -> None:
    assert loaded_after("import ckptfs\nassert 'ckptfs.api' not in sys.modules") == []


def test_the_api_imports_no_heavy_library() -> None:
    assert loaded_after("import ckptfs\nckptfs.wait_durable, ckptfs.NotDurableError") == []


def test_unknown_attribute() -> None:
    assert loaded_after("import ckptfs\ntry:\n    ckptfs.nothing\nexcept AttributeError:\n"
                        "    pass\nelse:\n    raise SystemExit(1)") == []
