"""The TARGET of a command: a mount, a path inside one, or a store URL, and its store opened."""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptfs.cli.control import status_of
from ckptfs.cli.errors import CliError, UsageError
from ckptfs.common.errors import NoEntry
from ckptfs.daemon import mounts

if TYPE_CHECKING:
    from ckptfs.store.base import Store
    from ckptfs.tools.inspection import Tiers

# the store modules are imported in open_target and default_endpoint, where a command
# opens its store: with them (numpy, trio) `ckptfs status --help` takes 0.24 s, not 0.07


def default_endpoint(url: str) -> str | None:
    """The endpoint the environment names for the store at `url` (store.default_endpoint)."""
    from ckptfs.store import default_endpoint as from_env  # opening a store: see above

    return from_env(url)


def mounted_path(arg: str) -> tuple[str, str] | None:
    """(mount point, path inside the filesystem) if `arg` lies in a ckptfs mount, else None."""
    return None if "://" in arg else mounts.containing(arg)


def mount_of(path: str) -> str:
    """The mount point of the ckptfs mount `path` lies in (status and sync take any path
    inside a mount, as the store tools do), else `path` itself."""
    mounted = mounted_path(path)
    return mounted[0] if mounted is not None else path


@dataclass
class Target:
    """What a store tool works on: a store, a path in its filesystem, how to show paths."""

    store: Store  # with a fast tier: the view of both tiers (fasttier.view)
    path: str
    mountpoint: str | None = None  # set when the user named a path inside a mount
    store_arg: str = ""  # the store as the user named it, cut at its root (hints)
    fast: Store | None = None  # the fast tier (--fast-tier), where the tool takes one
    slow: Store | None = None  # with a fast tier: the object store alone
    fast_url: str = ""  # the fast tier of the mount the user named a path in, if any

    def object_store(self) -> Store:
        """The store without its fast tier."""
        return self.slow if self.slow is not None else self.store

    def tiers(self) -> Tiers | None:
        """The fast tier and the object store apart (the inspection tools' Tiers), or None
        without a fast tier."""
        if self.fast is None or self.slow is None:
            return None
        from ckptfs.tools.inspection import Tiers  # opening a store: see the top

        return Tiers(self.fast, self.slow)

    def show(self, path: str) -> str:
        """`path` (relative to the filesystem root) as the user would name it."""
        if self.mountpoint is not None:
            return os.path.join(self.mountpoint, path) if path else self.mountpoint
        return path or "."

    def names(self, path: str) -> str:
        """The TARGET [PATH] words of a command that names `path` (as show() prints it):
        the mounted path, or the store and the path."""
        if self.mountpoint is not None:
            return shlex.quote(path)
        return f"{shlex.quote(self.store_arg)} {shlex.quote(path)}"


def store_path(arg: str, base: str = "") -> str:
    """The path in the filesystem that PATH `arg` names below `base` (from the store's
    root when it starts with '/'); '.' and empty segments are dropped. UsageError for a
    '..' segment: a path in a store never leaves it."""
    if ".." in arg.split("/"):
        raise UsageError(f"'..' in a path in the store: {arg}; give the path from the "
                         f"store's root (/run7/step-9) or below the TARGET (step-9)")
    if "\0" in arg:
        raise UsageError(f"a NUL character in the path {arg!r}")
    parts = [] if arg.startswith("/") else base.split("/")
    return "/".join(p for p in [*parts, *arg.split("/")] if p not in ("", "."))


def retyped(a: argparse.Namespace, words: list[str]) -> str:
    """The command the user ran, with its TARGET (and PATH, if given) replaced by
    `words`: a hint that works."""
    argv: list[str] = list(getattr(a, "argv", []))
    given = [a.target, *([p] if (p := target_path_arg(a)) else [])]
    for i in range(len(argv) - len(given) + 1):
        if argv[i:i + len(given)] == given:
            argv[i:i + len(given)] = words
            break
    return "ckptfs " + shlex.join(argv)


def target_path_arg(a: argparse.Namespace) -> str:
    """The PATH (or DIR) argument given after TARGET, or ''."""
    return str(getattr(a, "path", "") or getattr(a, "dir", "") or "")


def open_target(a: argparse.Namespace, path_arg: str | None = None,
                whole_store: bool = False, create_fast_tier: bool = False) -> Target:
    """Open the store of `a.target`: a path inside a ckptfs mount, or a store URL, or a
    URL below a store (its path there, as git finds .git: locate.py), and PATH after it.
    With `whole_store` (gc, fsck, upgrade), a URL below a store is refused with the
    command that works. A tool that takes --fast-tier gets the fast tier too (unless
    told --no-fast-tier); with `create_fast_tier` (drain), a directory that is no fast
    tier yet becomes this store's, as a mount's --fast-tier makes it."""
    target = _open_target(a, path_arg, whole_store)
    if hasattr(a, "fast_tier") and not getattr(a, "no_fast_tier", False):
        _open_fast_tier(a, target, create_fast_tier)
    return target


def _open_fast_tier(a: argparse.Namespace, target: Target, create: bool) -> None:
    """The fast tier of --fast-tier, $CKPTFS_FAST_TIER or the mount's, into `target`
    (its `store` becomes the view of both tiers); UsageError for one of another store."""
    url = a.fast_tier or (target.fast_url if target.mountpoint is not None
                          else os.environ.get("CKPTFS_FAST_TIER", ""))
    if not url:
        return
    from ckptfs.common.errors import ConfigError
    from ckptfs.pipeline import fasttier  # opening a store: see the top of this module

    try:
        fast = fasttier.attach(url, target.store, create=create)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    target.fast, target.slow = fast, target.store
    target.store = fasttier.view(fast, target.store)


def _open_target(a: argparse.Namespace, path_arg: str | None, whole_store: bool) -> Target:
    mounted = mounted_path(a.target)
    if mounted is not None:
        if path_arg:
            raise UsageError(f"{a.target} is a path in a ckptfs mount; give either a "
                             f"mounted path or STORE and a path in it, not both")
        return _mounted_target(a, *mounted)
    from ckptfs.daemon import locate  # opening a store: see the top of this module
    from ckptfs.format.manifests import INFO_KEY
    from ckptfs.tools import inspection

    found = locate.locate(a.target, endpoint_url=a.endpoint_url or default_endpoint(a.target),
                          region=getattr(a, "region", None))
    if found.layout is not None:
        path = found.named_path
        extra = store_path(path_arg or "", path) if path_arg else path
        words = [found.url, *([extra] if extra and not whole_store else [])]
        raise UsageError(found.layout_refusal(a.target, retyped(a, words), len(words) > 1))
    if whole_store and found.rest:
        hint = retyped(a, [found.url])
        also = (f"; to check only that path: ckptfs verify {shlex.quote(found.url)} "
                f"{shlex.quote(found.rest)}" if a.command == "fsck" else "")
        raise UsageError(f"{a.command} works on a whole store, and {a.target} is the "
                         f"path {found.rest} inside the ckptfs store {found.url}; for that "
                         f"store: {hint}{also}")
    if not found.found:
        try:
            inspection.check_is_store(found.store)
        except NoEntry:
            raise NoEntry(f"not a ckptfs store, nor a path inside one: no {INFO_KEY} at "
                          f"{found.store.url} or up to {locate.MAX_LEVELS} levels above "
                          f"it") from None
    return Target(found.store, store_path(path_arg or "", found.rest), store_arg=found.url)


def _mounted_target(a: argparse.Namespace, mountpoint: str, path: str) -> Target:
    """The store of the mount at `mountpoint`, as its daemon names it, and `path` in it."""
    from ckptfs.store import open_store  # opening a store: see the top of this module

    try:
        st = status_of(mountpoint)
    except CliError as e:
        raise CliError(f"{e}; name the store instead: STORE [PATH]") from None
    store_arg = str(st["store_arg"])
    if "://" not in store_arg and not os.path.isabs(os.path.expanduser(store_arg)):
        store_arg = str(st["store"])  # relative to the daemon's cwd: its file:// URL
    store = open_store(store_arg, endpoint_url=a.endpoint_url or st.get("endpoint_url")
                       or default_endpoint(store_arg), region=getattr(a, "region", None))
    check = getattr(store, "check", None)
    if check is not None:
        check()
    # the mount point as the user spelled it, so printed paths match theirs
    shown = os.path.abspath(a.target)
    if path:
        shown = shown[:-len(path) - 1] if shown.endswith("/" + path) else mountpoint
    return Target(store, path, shown, shown, fast_url=str(st.get("fast_tier") or ""))
