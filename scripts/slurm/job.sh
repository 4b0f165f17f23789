#!/bin/sh
# An sbatch script with ckptfs: the prolog mounted the store on every node; the job
# trains, saving checkpoints into the mount, and its last step waits until they are in
# the store, so the job fails (and says so) when they are not.
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
set -eu
ckptfs=${CKPTFS:-ckptfs}
mnt=${CKPTFS_MOUNTPOINT:-/mnt/ckpt}
${SRUN-srun} ${TRAIN:-python train.py --output-dir "$mnt/run7" --resume latest}
# every node's checkpoints durable, or the job fails
${SRUN-srun} $ckptfs sync "$mnt" --timeout "${CKPTFS_SYNC_TIMEOUT:-1800}"
