"""The names a mount accepts: UTF-8, at most NAME_MAX bytes, and keys the store can hold."""

from __future__ import annotations

import logging

from ckptfs.common.errors import Exists, InvalidArgument, KeyTooLongError, NameTooLong, StoreError
from ckptfs.format import manifests
from ckptfs.fs.namespace import DirNode
from ckptfs.store.base import AsyncStore

log = logging.getLogger(__name__)

NAME_MAX = 255  # bytes, as on ext4 and xfs (the directory store maps longer file names)


def check_name_free(store: AsyncStore, parent: DirNode, name: str, is_dir: bool = False
                    ) -> None:
    """EEXIST, EINVAL or ENAMETOOLONG unless `name` can be made in `parent`."""
    path = manifests.join(parent.path, name)
    if name in parent.children:
        raise Exists(path)
    if "/" in name or "\0" in name or name in (".", ".."):
        raise InvalidArgument(name)
    check_name(name)
    check_fits(store, manifests.dir_key(path) if is_dir else manifests.file_key(path))


def check_fits(store: AsyncStore, key: str) -> None:
    """ENAMETOOLONG for a key the store cannot hold (S3: 1024 bytes in all)."""
    try:
        store.check_length(key)
    except KeyTooLongError as e:
        raise NameTooLong(str(e)) from None


async def check_tree_fits(store: AsyncStore, src: DirNode, new_path: str) -> None:
    """ENAMETOOLONG if moving the directory `src` to `new_path` would give a key the
    store cannot hold: every entry known here, and, when a directory below `src` was
    never listed, every key the store has below it (the publisher checks again before
    it copies anything)."""
    old_prefix = manifests.dir_key(src.path)
    keys = [old_prefix]
    complete = True
    todo = [src]
    while todo:
        dnode = todo.pop()
        complete = complete and dnode.listed
        for child in dnode.children.values():
            if isinstance(child, DirNode):
                keys.append(manifests.dir_key(child.path))
                todo.append(child)
            else:
                keys.append(manifests.file_key(child.path))
    if not complete:
        try:
            listing = await store.list(old_prefix, delimiter=None)
            keys += [k for k, _ in listing.objects]
        except StoreError as e:
            log.warning("cannot list %s to check its new key lengths: %s", src.path, e)
    new_prefix = manifests.dir_key(new_path)
    for key in keys:
        check_fits(store, new_prefix + key[len(old_prefix):])


def check_name(name: str) -> None:
    """Names must be UTF-8 (store keys are) and at most NAME_MAX bytes."""
    try:
        encoded = name.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(f"file name is not UTF-8: {name!r}") from None
    if len(encoded) > NAME_MAX:
        raise NameTooLong(name)
