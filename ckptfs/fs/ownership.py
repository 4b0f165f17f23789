"""Owners and modes: what stat shows of an entry, and who may chown or chmod it (POSIX)."""

from __future__ import annotations

import stat
from dataclasses import dataclass

from ckptfs.common.errors import NotPermitted
from ckptfs.format.manifests import kept_mode
from ckptfs.fs.namespace import Node


@dataclass(frozen=True)
class Caller:
    """Who makes a request: the uid and gid of the FUSE request, and (only where a
    chown needs them) the supplementary groups of its process."""

    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


@dataclass(frozen=True)
class Ownership:
    """A mount's rules for owners and modes. An entry is owned by the uid and gid its
    record names (its creator's, or a chown's); a record that names none (written by an
    older ckptfs, or by a caller that did not say who it is) shows the mounting user's.
    `force_uid`, `force_gid`, `file_mode`, `dir_mode` (--uid, --gid, --file-mode,
    --dir-mode) replace what stat shows, not what is stored; a change of an attribute
    they fix is refused."""

    uid: int  # the mounting user
    gid: int
    force_uid: int | None = None
    force_gid: int | None = None
    file_mode: int | None = None
    dir_mode: int | None = None

    @property
    def mounter(self) -> Caller:
        """The mounting user, as a caller (the core's calls that name no caller)."""
        return Caller(self.uid, self.gid)

    def stored_owner(self, node: Node) -> tuple[int, int]:
        """The uid and gid the node's record names, or the mounting user's."""
        return (self.uid if node.uid is None else node.uid,
                self.gid if node.gid is None else node.gid)

    def owner(self, node: Node) -> tuple[int, int]:
        """The st_uid and st_gid the node shows."""
        uid, gid = self.stored_owner(node)
        return (uid if self.force_uid is None else self.force_uid,
                gid if self.force_gid is None else self.force_gid)

    def forced_mode(self, node: Node) -> int | None:
        """The permission bits --file-mode or --dir-mode give the node, if any."""
        if node.is_dir:
            return self.dir_mode
        return None if node.is_symlink else self.file_mode

    def mode(self, node: Node) -> int:
        """The st_mode the node shows (never setuid or setgid)."""
        forced = self.forced_mode(node)
        return kept_mode(node.mode if forced is None else stat.S_IFMT(node.mode) | forced)

    def chown(self, node: Node, uid: int | None, gid: int | None,
              caller: Caller) -> tuple[int, int] | None:
        """The uid and gid to record after chown(uid, gid) by `caller` (None or -1: that
        one unchanged), or None if nothing changes. NotPermitted as POSIX says: only root
        gives an entry to another user; the owner may change its group to one of their
        own groups; nobody changes what --uid or --gid fixes."""
        shown_uid, shown_gid = self.owner(node)
        new_uid = None if uid is None or uid in (-1, shown_uid) else uid
        new_gid = None if gid is None or gid in (-1, shown_gid) else gid
        if new_uid is None and new_gid is None:
            return None
        if (new_uid is not None and self.force_uid is not None) or (
                new_gid is not None and self.force_gid is not None):
            raise NotPermitted(f"{node.path}: the owner is fixed by --uid/--gid")
        if caller.uid != 0:
            if new_uid is not None:
                raise NotPermitted(f"{node.path}: only root can give it to another user")
            assert new_gid is not None
            if caller.uid != shown_uid or not caller.in_group(new_gid):
                raise NotPermitted(f"{node.path}: only its owner can change its group, to "
                                   f"one of their own groups")
        stored_uid, stored_gid = self.stored_owner(node)
        return (stored_uid if new_uid is None else new_uid,
                stored_gid if new_gid is None else new_gid)

    def check_chmod(self, node: Node, caller: Caller) -> None:
        """NotPermitted unless `caller` may chmod the node: root or its owner, and the
        mode is not fixed by --file-mode or --dir-mode."""
        if self.forced_mode(node) is not None:
            raise NotPermitted(f"{node.path}: its mode is fixed by --file-mode/--dir-mode")
        if caller.uid not in (0, self.owner(node)[0]):
            raise NotPermitted(f"{node.path}: only its owner can change its mode")
