"""The filesystem core's options: the part of the MountConfig it reads."""

from __future__ import annotations

from dataclasses import dataclass

from ckptfs.common.config import MountConfig


@dataclass
class Options:
    """The filesystem core's part of the MountConfig (its defaults are MountConfig's,
    documented there; the daemon builds them with `of`)."""

    metadata_ttl: float = MountConfig.metadata_ttl
    publish_timeout: float = MountConfig.publish_timeout
    prefetch_window: int = MountConfig.prefetch_window  # bytes ahead of each reader (0: none)
    fsync_to_store: bool = MountConfig.fsync_to_store
    writer_id: str = ""
    control_socket: str = ""
    # --uid, --gid, --file-mode, --dir-mode: what stat shows (None: the entry's own)
    uid: int | None = None
    gid: int | None = None
    file_mode: int | None = None
    dir_mode: int | None = None

    @classmethod
    def of(cls, cfg: MountConfig, control_socket: str) -> Options:
        """The options of a mount of `cfg`: its prefetch window at most a quarter of the
        cache, so that prefetched chunks cannot crowd out the dirty data."""
        return cls(metadata_ttl=cfg.metadata_ttl, publish_timeout=cfg.publish_timeout,
                   prefetch_window=min(cfg.prefetch_window, cfg.cache_size // 4),
                   fsync_to_store=cfg.fsync_to_store, writer_id=cfg.node_id,
                   control_socket=control_socket, uid=cfg.uid, gid=cfg.gid,
                   file_mode=cfg.file_mode, dir_mode=cfg.dir_mode)
