"""ckptfs: a FUSE checkpoint store with a local write-back cache over object storage."""

__version__ = "0.1.0"
