"""The FUSE edge and a mount's life: pyfuse3 operations, mount and serve, control socket.

Also the mount table. May import ckptfs.fs and below.
"""
