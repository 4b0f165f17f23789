#!/bin/sh
# SLURM Prolog for ckptfs: mount the job's checkpoint store once on this node.
#
# slurm.conf: Prolog=/etc/slurm/ckptfs-prolog.sh (this file), with the settings below in
# the environment (a file sourced here, /etc/default/ckptfs, is the usual place):
#   CKPTFS_STORE        the store URL, e.g. s3://bucket/run7 (required)
#   CKPTFS_MOUNTPOINT   where to mount it (default /mnt/ckpt)
#   CKPTFS_CACHE_DIR, CKPTFS_CACHE_SIZE, CKPTFS_ENDPOINT_URL, ...: any mount option
#   CKPTFS              the ckptfs command (default: ckptfs on PATH)
# Exit status non-zero makes SLURM drain the node and requeue the job.
set -eu
[ -r /etc/default/ckptfs ] && . /etc/default/ckptfs
ckptfs=${CKPTFS:-ckptfs}
mnt=${CKPTFS_MOUNTPOINT:-/mnt/ckpt}
: "${CKPTFS_STORE:?set CKPTFS_STORE to the store URL, e.g. s3://bucket/run7}"
if $ckptfs status "$mnt" >/dev/null 2>&1; then
    exit 0  # mounted already (an earlier job on this node)
fi
mkdir -p "$mnt"
exec $ckptfs mount "$CKPTFS_STORE" "$mnt"
