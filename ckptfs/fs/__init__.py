"""The file system without the kernel: write buffers, namespace, listings, CheckpointFS.

Also auto-prune. May import ckptfs.pipeline and the layers below it.
"""
