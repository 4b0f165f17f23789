"""The `ckptfs` command line: its parser, and running a command with its exit status."""

from __future__ import annotations

import argparse
import os
import select
import sys
from collections.abc import Callable
from typing import Any

from ckptfs import __version__
from ckptfs.cli.drain import add_drain_parser
from ckptfs.cli.du import add_du_parser
from ckptfs.cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_PIPE, CliError, UsageError
from ckptfs.cli.gc import add_gc_parser
from ckptfs.cli.inspection import add_inspection_parsers
from ckptfs.cli.mount import add_mount_parser, mount_helper
from ckptfs.cli.options import STORE_FORMS
from ckptfs.cli.prune import add_prune_parser
from ckptfs.cli.status import add_status_parsers
from ckptfs.cli.trash import add_trash_parser
from ckptfs.cli.umount import add_umount_parser
from ckptfs.cli.upgrade import add_upgrade_parser
from ckptfs.cli.warmup import add_warmup_parser
from ckptfs.common.errors import CkptfsError
from ckptfs.common.redact import redact


class ArgumentParser(argparse.ArgumentParser):
    """argparse's, but a help or usage text that cannot be written (`ckptfs --help |
    head -1`) raises BrokenPipeError, which main() answers with EXIT_PIPE: argparse itself
    drops the error (and, on CPython 3.11.7, flushes first), which ended in exit 0."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (file or sys.stderr).write(message)


def parser() -> argparse.ArgumentParser:
    """The parser of every command, in the order `ckptfs --help` lists them."""
    p = ArgumentParser(
        prog="ckptfs", description="A FUSE checkpoint store: writes land in a local cache at "
        "disk speed and go to object storage (S3, Azure Blob, GCS or a directory) in the "
        "background.",
        epilog="A STORE is " + STORE_FORMS + ". The store tools also take a URL below a "
        "store (s3://bucket/run7/step-1000: the path step-1000 of the store s3://bucket/run7, "
        "found by walking up to its ckptfs.json) and a path inside a mount. "
        "docs/OPERATIONS.md has every command.")
    p.add_argument("--version", action="version", version=f"ckptfs {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (add_mount_parser, add_umount_parser, add_status_parsers,
                add_inspection_parsers, add_gc_parser, add_du_parser, add_prune_parser,
                add_trash_parser, add_upgrade_parser, add_drain_parser, add_warmup_parser):
        add(sub)
    p.set_defaults(commands=frozenset(sub.choices))
    return p


def negative_values_joined(argv: list[str]) -> list[str]:
    """`--grace -1h` as `--grace=-1h`: argparse would take '-1h' for an option and print
    its usage; joined, the value reaches parse_duration, which refuses it in one line."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--grace" and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"--grace={arg}"
        else:
            out.append(arg)
    return out


def output_closed(e: OSError) -> bool:
    """`e` is the EPIPE of writing to a stdout whose reader went away (poll reports an
    error on a pipe's write end once its read end is closed), not one from a socket."""
    if not isinstance(e, BrokenPipeError):
        return False
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError):
        return True  # no stdout to poll (closed): its write failed


def main(argv: list[str] | None = None) -> int:
    """The `ckptfs` command: run `argv` (default: the process's arguments); its exit
    status, EXIT_PIPE when its output pipe was closed."""
    try:
        try:
            return run(sys.argv[1:] if argv is None else argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not at exit as a traceback
    except BrokenPipeError as e:
        if not output_closed(e):
            raise
        # quietly, as coreutils: nothing more can be written, and the flush at exit must
        # not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE


def run(argv: list[str]) -> int:
    """Parse `argv` and run its command: its exit status, or one line on stderr and the
    command's error status."""
    p = parser()
    if helper_form(p, argv):
        return run_command(mount_helper, argv, 1)
    args = p.parse_args(negative_values_joined(argv))
    args.argv = argv
    return run_command(args.func, args, int(getattr(args, "error_exit", 1)))


def helper_form(p: argparse.ArgumentParser, argv: list[str]) -> bool:
    """`argv` is `STORE MOUNTPOINT ...` (how mount(8) runs ckptfs), not a command."""
    return (len(argv) >= 2 and not argv[0].startswith("-")
            and argv[0] not in p.get_default("commands"))


def run_command(func: Callable[[Any], int], arg: Any, error_exit: int) -> int:
    """Run one command: its exit status, or one line on stderr and `error_exit`."""
    try:
        return int(func(arg))
    except UsageError as e:
        print(f"ckptfs: {redact(e)}", file=sys.stderr)
        return EXIT_ERROR
    except (CliError, CkptfsError) as e:  # may quote an endpoint or a connection string
        print(f"ckptfs: {redact(e)}", file=sys.stderr)
        return error_exit
    except KeyboardInterrupt:
        print("ckptfs: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
