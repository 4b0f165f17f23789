"""The store format: chunk boundaries, chunk codecs, manifests, torch record cutting.

May import ckptfs.common only (never a store).
"""
