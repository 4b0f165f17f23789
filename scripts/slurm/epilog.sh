#!/bin/sh
# SLURM Epilog for ckptfs: flush every checkpoint to the store, then unmount.
#
# slurm.conf: Epilog=/etc/slurm/ckptfs-epilog.sh (this file); same environment as
# prolog.sh, plus CKPTFS_UMOUNT_TIMEOUT (seconds, default 1800).
# `ckptfs umount` exits 0 only when everything written on this node is in the store.
# Otherwise this exits 1 with what is not durable: SLURM then drains the node, whose
# cache directory still holds the data; the next mount of it (same --cache-dir) uploads
# the rest. To fail the job itself instead, end the batch script with `ckptfs sync`
# (see job.sh).
set -u
[ -r /etc/default/ckptfs ] && . /etc/default/ckptfs
ckptfs=${CKPTFS:-ckptfs}
mnt=${CKPTFS_MOUNTPOINT:-/mnt/ckpt}
if ! $ckptfs status "$mnt" >/dev/null 2>&1 && ! grep -q " $mnt fuse.ckptfs " /proc/mounts; then
    exit 0  # nothing mounted here
fi
if $ckptfs umount "$mnt" --timeout "${CKPTFS_UMOUNT_TIMEOUT:-1800}"; then
    exit 0
fi
echo "ckptfs epilog: checkpoints on $(hostname) are not all in the store; the node's cache keeps them" >&2
$ckptfs status "$mnt" >&2 || true
exit 1
