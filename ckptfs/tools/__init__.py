"""Tools that work on a store alone: inspection, trash, gc, retention, usage.

May import ckptfs.format, ckptfs.store and ckptfs.common.
"""
