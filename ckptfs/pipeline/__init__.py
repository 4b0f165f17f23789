"""Between a mount and its store: cache, journal, uploader, fetcher, publisher, recovery.

May import ckptfs.tools and the layers below it.
"""
