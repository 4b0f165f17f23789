"""The `ckptfs` command, a module per command or group: this package gives its main()."""

from ckptfs.cli.main import main

__all__ = ["main"]
