#!/bin/sh
# torchrun with ckptfs, run once per node (by srun, mpirun -npernode 1, or by hand):
# mount the store unless mounted, train, then wait until this node's checkpoints are in
# the store. Exits non-zero when the training failed or the checkpoints are not durable.
#
#   CKPTFS_STORE=s3://bucket/run7 scripts/launch/torchrun.sh --nproc-per-node 8 train.py
#
# Settings from the environment: CKPTFS_STORE (required), CKPTFS_MOUNTPOINT (default
# /mnt/ckpt), CKPTFS_SYNC_TIMEOUT (seconds, default 1800), any mount option as CKPTFS_*
# (CKPTFS_CACHE_DIR, ...), CKPTFS (the ckptfs command), TORCHRUN (default torchrun).
set -u
ckptfs=${CKPTFS:-ckptfs}
mnt=${CKPTFS_MOUNTPOINT:-/mnt/ckpt}
: "${CKPTFS_STORE:?set CKPTFS_STORE to the store URL, e.g. s3://bucket/run7}"
if ! $ckptfs status "$mnt" >/dev/null 2>&1; then
    mkdir -p "$mnt" && $ckptfs mount "$CKPTFS_STORE" "$mnt" || exit 1
fi
${TORCHRUN:-torchrun} "$@"
trained=$?
$ckptfs sync "$mnt" --timeout "${CKPTFS_SYNC_TIMEOUT:-1800}" || exit 1
exit $trained
