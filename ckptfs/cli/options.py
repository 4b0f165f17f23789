"""The arguments and help texts the commands share: TARGET, the store options, --dry-run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ckptfs.cli.errors import EXIT_ERROR
from ckptfs.common.config import ENDPOINT_HELP

#: every kind of store, as a URL names it
STORE_FORMS = ("s3://bucket[/prefix], az://container[/prefix], gs://bucket[/prefix], "
               "file:///path or a directory")
STORE_HELP = ("TARGET is a path inside a ckptfs mount (its store is found through the mount's "
              "daemon) or a STORE: " + STORE_FORMS + ". A URL may go on below the store "
              "(s3://bucket/run7/step-1000, store/run7): the store is found by walking up to "
              "the nearest ckptfs.json (at most 16 levels), and the rest is a path in its "
              "filesystem. PATH, with a STORE, is below that, or from the store's root when "
              "it starts with '/'; '..' is refused. Works from any machine "
              "that can reach the store; no mount needed. It sees what is in the store: a "
              "file still open, or closed but not yet published on its node, is not there.")
#: the TARGET of gc, fsck and upgrade
WHOLE_STORE_HELP = ("TARGET is a STORE (" + STORE_FORMS + ") or a path in a ckptfs mount "
                    "(its whole store). A URL below a store (s3://bucket/run7/step-1000) is "
                    "refused with the command that names the store.")
#: --endpoint-url means the endpoint of whatever store the URL names
TOOL_ENDPOINT_HELP = ENDPOINT_HELP[:-1] + "; or the mount's when TARGET is a mounted path)"
REGION_HELP = "S3 region (default: the AWS config chain)"
DIR_HELP = "with STORE: the directory holding the checkpoints (default: root)"
PATTERN_HELP = ("shell pattern of checkpoint directory names, e.g. 'checkpoint-*', "
                "'global_step*', 'step-*' (default: '*')")


def add_command(sub: Any, name: str, func: Callable[[argparse.Namespace], int], help: str,
                description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of `ckptfs NAME`, which runs `func` on the arguments it parses."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description,
                                                epilog=epilog)
    p.set_defaults(func=func)
    return p


def add_target(p: argparse.ArgumentParser, target_help: str, path: str = "",
               path_help: str = DIR_HELP) -> None:
    """TARGET, then (when `path` names it: 'path', 'dir') the optional PATH or DIR."""
    p.add_argument("target", metavar="TARGET", help=target_help)
    if path:
        p.add_argument(path, metavar=path.upper(), nargs="?", default="", help=path_help)


def add_dry_run(p: argparse.ArgumentParser, done: str) -> None:
    """--dry-run: change nothing, say what would be `done` ('removed', 'deleted')."""
    p.add_argument("--dry-run", action="store_true",
                   help=f"change nothing, say what would be {done}")


def add_store_options(p: argparse.ArgumentParser, json: bool = True,
                      fast_tier: str | None = None) -> None:
    """--json (unless not `json`), --endpoint-url and --region of a store tool, which exits
    2 when it cannot work; --fast-tier DIR too where `fast_tier` says what it does there."""
    if json:
        p.add_argument("--json", action="store_true", help="machine-readable output")
    if fast_tier is not None:
        p.add_argument("--fast-tier", metavar="DIR", help=f"the fast tier the mounts of "
                       f"STORE use (their --fast-tier): {fast_tier} (default: "
                       f"$CKPTFS_FAST_TIER; with a mounted path, the mount's)")
    p.add_argument("--endpoint-url", help=TOOL_ENDPOINT_HELP)
    p.add_argument("--region", help=REGION_HELP)
    p.set_defaults(error_exit=EXIT_ERROR)
