"""ckptfs: a FUSE checkpoint store with a local write-back cache over object storage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The Python API (ckptfs.api) for training code, imported on first use: `import ckptfs`
# (and the command line) stays free of it, and the API itself of pyfuse3, trio and the
# store libraries.
__all__ = ["CkptfsError", "DaemonGoneError", "DataLostError", "NotCkptfsError",
           "NotDurableError", "STATES", "latest_complete", "state", "wait_durable"]

if TYPE_CHECKING:
    from ckptfs.api import (
        STATES,
        CkptfsError,
        DaemonGoneError,
        DataLostError,
        NotCkptfsError,
        NotDurableError,
        latest_complete,
        state,
        wait_durable,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ckptfs import api

        return getattr(api, name)
    raise AttributeError(f"module 'ckptfs' has no attribute {name!r}")
