"""The store a URL lies in, found as git finds .git: the nearest ckptfs.json up from it."""

from __future__ import annotations

import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from ckptfs.common.errors import ConfigError, StoreError
from ckptfs.format import manifests
from ckptfs.store import LocalStore, open_store
from ckptfs.store import directory_of as store_directory
from ckptfs.store.base import Store

log = logging.getLogger(__name__)

#: how many directories or key prefixes above a URL are looked at for a ckptfs.json (one
#: HEAD each on a cloud store): a path deeper than this inside a store is named as STORE
#: PATH instead
MAX_LEVELS = 16

#: the store's own top-level parts, and what each holds: never a path of its filesystem
#: when a URL names one
LAYOUT = {
    manifests.FILES: "the manifests of its files",
    manifests.CHUNKS: "the chunks",
    manifests.FOSSILS: "the chunks gc set aside",
    manifests.TRASH: "the deleted files",
    manifests.INTENTS: "the directory renames in flight",
    manifests.GC: "gc's clock probes",
}


@dataclass(frozen=True)
class Located:
    """Where a URL points: the store it lies in, and what it names below that store."""

    store: Store     # opened at the store's root
    url: str         # the store as the user typed it, cut at its root: 's3://b/run1', 's1'
    rest: str        # the '/'-separated part below it; '' when the URL names the store
    found: bool      # a ckptfs.json was found (False: `store` is the URL's own place)

    @property
    def layout(self) -> str | None:
        """The store's part ('files/', 'chunks/', ...) the rest lies in, if it does."""
        top = self.rest.partition("/")[0] + "/"
        return top if self.rest and top in LAYOUT else None

    @property
    def named_path(self) -> str:
        """The filesystem path the rest names: itself, or for a pasted key of a manifest
        or marker (files/P), P; '' for the other parts of the layout."""
        if self.layout == manifests.FILES:
            return self.rest[len(manifests.FILES):].rstrip("/")
        return "" if self.layout else self.rest

    def layout_refusal(self, given: str, hint: str, with_path: bool) -> str:
        """The one-line refusal of `given`, a URL into the store's layout, ending with
        `hint`, the command that works (`with_path`: it names a path in the store)."""
        assert self.layout is not None
        return (f"{given} is not a path of a filesystem: it lies in {self.layout} of the "
                f"ckptfs store {self.url}, where it keeps {LAYOUT[self.layout]}; name the "
                f"store{' and a path in it' if with_path else ''}: {hint}")


def levels_up(arg: str, levels: int) -> tuple[str, str]:
    """A store argument as the user typed it, `levels` directories or key prefixes up, and
    the path from there down to it: ('s3://b/run1', 'step-3') for ('s3://b/run1/step-3', 1)."""
    scheme, sep, rest = arg.partition("://")
    if sep and scheme.lower() != "file":
        rest = rest.rstrip("/")
    else:
        rest = os.path.normpath(os.path.expanduser(rest if sep else arg))
        if len(rest.split("/")) <= levels or ".." in rest.split("/")[-levels:]:
            rest = os.path.abspath(rest)
    parts = rest.split("/")
    up = "/".join(parts[:-levels]) or ("/" if rest.startswith("/") else ".")
    return f"{scheme}{sep}{up}" if sep else up, "/".join(parts[-levels:])


def _has_info(store: Store, level: int) -> bool:
    """The store has a ckptfs.json; a place above the URL (`level` > 0) that cannot be
    read (permissions, another tenant's prefix) counts as none."""
    try:
        return store.head(manifests.INFO_KEY) is not None
    except StoreError as e:
        if level == 0:
            raise
        log.debug("cannot look for a store at %s: %s", store.url, e)
        return False


def enclosing(store: Store, arg: str, start: int = 1) -> Located | None:
    """The nearest store at or above `store` (the place `arg` names), from `start` levels
    up, at most MAX_LEVELS; None if there is none."""
    place: Store | None = store
    for _ in range(start):
        place = place.parent() if place is not None else None
    level = start
    while place is not None and level <= MAX_LEVELS:
        if _has_info(place, level):
            if level == 0:
                return Located(place, arg, "", True)
            up, rest = levels_up(arg, level)
            return Located(place, up, rest, True)
        place, level = place.parent(), level + 1
    return None


def _enclosing_directory(arg: str, path: Path) -> Located | None:
    """enclosing() for a directory path, which need not exist (a path inside a directory
    store is a path of its filesystem, not a directory of the store's own)."""
    for level in range(MAX_LEVELS + 1):
        if path.is_dir() and _has_info(LocalStore(path), level):
            store = LocalStore(path)
            if level == 0:
                return Located(store, arg, "", True)
            up, rest = levels_up(arg, level)
            return Located(store, up, rest, True)
        if path.parent == path:
            break
        path = path.parent
    return None


def locate(url: str, endpoint_url: str | None = None, region: str | None = None) -> Located:
    """The store `url` lies in: the URL's own place when it holds a ckptfs.json, else the
    nearest one above it (at most MAX_LEVELS up). When there is none, the URL's own place
    with `found` False (a store that lost its ckptfs.json keeps its layout: fsck checks
    it); ConfigError when that place does not even exist (a directory)."""
    directory = store_directory(url)
    if directory is not None:
        found = _enclosing_directory(url, Path(os.path.abspath(directory)))
        if found is not None:
            return found
        if not os.path.isdir(directory):
            raise ConfigError(f"store directory does not exist: {directory}, and no "
                              f"directory up to {MAX_LEVELS} levels above it is a ckptfs "
                              f"store")
        return Located(open_store(url), url, "", False)
    store = open_store(url, endpoint_url=endpoint_url, region=region)
    check = getattr(store, "check", None)
    if check is not None:
        check()  # a missing bucket is one line, before any walk
    found = enclosing(store, url, start=0)
    return found if found is not None else Located(store, url, "", False)


def mount_refusal(store: Store, arg: str, mountpoint: str) -> None:
    """ConfigError if a new store at `store` (the URL `arg`) would lie inside an existing
    one: a typo such as s3://bucket/run1/step-3 for the path step-3 of the store
    s3://bucket/run1, or a directory of a store's own layout such as store/files."""
    found = enclosing(store, arg)
    if found is not None:
        raise ConfigError(mount_hint(found, arg, mountpoint))


def mount_hint(found: Located, arg: str, mountpoint: str) -> str:
    """Why `arg`, below the store `found`, is not mounted, and the mount that works."""
    command = f"ckptfs mount {shlex.quote(found.url)} {shlex.quote(mountpoint)}"
    path = found.named_path
    if found.layout is None:
        return (f"{found.url} is a ckptfs store; mount it and use the path {path} inside "
                f"it: {command}")
    then = f", then use {os.path.join(mountpoint, path)}" if path else ""
    return (f"{arg} lies in {found.layout} of the ckptfs store {found.url}, where it keeps "
            f"{LAYOUT[found.layout]}; mount the store: {command}{then}")


def missing_directory_hint(arg: str, mountpoint: str) -> str | None:
    """For a directory store `arg` that does not exist: the mount that works when it lies
    inside a store (s1/run2 for the path run2 of the store s1), else None."""
    directory = store_directory(arg)
    if directory is None or os.path.isdir(directory):
        return None
    found = _enclosing_directory(arg, Path(os.path.abspath(directory)))
    return None if found is None else mount_hint(found, arg, mountpoint)
