#!/usr/bin/env bash
# Runs ckptfs's benchmarks on a training node with no package registry, from the bundle
# that scripts/node/make.sh builds (.node/, this file's directory). As root, on x86-64
# Linux with /dev/fuse and a Python (default python3, PY=...) that has torch:
#
#   bash .node/run.sh [all|quick|bench|ranks|cold-read|fast|check]
#
#   all        bench, then ranks, then cold-read, then fast
#   quick      the same, small and once: does everything work here?
#   bench      scripts/bench.py: save, durable, cold load, daemon CPU and GIL per GiB
#   ranks      scripts/bench_scale.py ranks: ranks saving their shards at once
#   cold-read  scripts/bench_cold_read.py: the mount apart from the read, torch.load
#              against a plain read, against the object store's own download
#   fast       scripts/bench.py --targets ck-fast,ck-s3: a directory as fast tier (in
#              FAST_DIR, e.g. on the cluster's Lustre or NFS; default under WORK) in front
#              of S3: close, fast-durable, durable, cold restores, load after warmup
#   check      set up, then one ckptfs mount written and read back (no torch needed)
#
# Everything is set up under WORK (default /tmp/ckptfs-node; nothing is installed into
# the node's Python) and what the steps print goes to OUT (default /tmp/ckptfs-node-out):
# log.txt (all of it, with the node's facts), bench.txt, ranks.txt, cold-read.txt, and
# prof/ with PROFILE=1. Knobs, with their defaults (quick's in brackets):
#   bench      GIB=1 [0.25]  RUNS=3 [1]  TARGETS=local,trivial,raw-s3,ck-s3,ck-dir
#              GIL=1 (0: no py-spy beside the daemons of bench and ranks)
#              PROFILE=0 (1: flame graphs in OUT/prof: bench's daemons, GIL holders
#              only, and the ranks' daemon)
#   ranks      RANK_MIB=256 [64]  RANKS=8 [2]  RANK_RUNS=1  RANK_TARGETS=local,trivial,ck-s3
#   cold-read  READ_GIB=1 [0.25]  READ_RUNS=3 [1]  VARIANTS='|--fetch-threads 16' [''],
#              mount options of each ckptfs variant, '|'-separated, '' = the defaults
#   fast       FAST_GIB=1 [0.25]  FAST_RUNS=3 [1]  FAST_DIR= (a directory on a shared file
#              system for the fast tier; a new directory is made in it and removed)
#   STEP_S=900  the time limit of each step, in seconds
set -euo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
what=${1:-all}
case $what in all|quick|bench|ranks|cold-read|fast|check) ;;
  *) echo "run.sh: unknown step '$what' (all, quick, bench, ranks, cold-read, fast, check)" >&2; exit 2;;
esac
if [ "$what" = quick ]; then
  : "${GIB:=0.25}" "${RUNS:=1}" "${RANK_MIB:=64}" "${RANKS:=2}" "${READ_GIB:=0.25}" \
    "${READ_RUNS:=1}" "${VARIANTS=}" "${FAST_GIB:=0.25}" "${FAST_RUNS:=1}"
fi
PY=${PY:-python3}
WORK=${WORK:-/tmp/ckptfs-node}
OUT=${OUT:-/tmp/ckptfs-node-out}
[ "$(id -u)" = 0 ] || { echo "run.sh: run as root (mounts, and the page cache is dropped)" >&2; exit 2; }
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1

echo "== the node, $(date -u +%FT%TZ)"
echo "cores $(nproc), $(free -g | awk '/^Mem:/ {print $2}') GiB, kernel $(uname -r), $($PY -V 2>&1)"
ls -l /dev/fuse
nvidia-smi -L 2>/dev/null || true

echo "== set-up in $WORK"
rm -rf "$WORK"
mkdir -p "$WORK"/{site,bin,fuse3,proj}
tar xzf "$bundle/proj.tgz" -C "$WORK/proj"
tar xzf "$bundle/fuse3.tgz" -C "$WORK/fuse3"
"$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
  "$bundle/weed.xz" "$WORK/bin/weed"
chmod +x "$WORK/bin/weed"
lib=$WORK/fuse3/usr/lib/x86_64-linux-gnu
[ -d "$lib" ] || lib=$WORK/fuse3/lib/x86_64-linux-gnu
export PATH=$WORK/bin:$WORK/fuse3/usr/bin:$WORK/fuse3/bin:$PATH
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
env -u PYTHONPATH "$PY" "$WORK/proj/scripts/node/wheels.py" "$bundle/wheels" "$WORK/site" "$WORK/bin"
export PYTHONPATH=$WORK/proj:$WORK/site PYTHONUNBUFFERED=1
if ! "$PY" -c 'import pyfuse3' 2>/dev/null && [ -f "$bundle/pyfuse3.tar.gz" ]; then
  echo "compiling pyfuse3 against the bundle's libfuse3"
  # pyfuse3's setup.py asks pkg-config for fuse3: a stand-in that answers for the bundle's
  printf '#!/bin/sh\ncase "$*" in\n *--modversion*) echo 3.14.0;;\n *--cflags*) echo "-I%s";;\n *--libs*) echo "-L%s -l:libfuse3.so.3 -lpthread";;\nesac\n' \
    "$WORK/fuse3/usr/include/fuse3" "$lib" > "$WORK/bin/pkg-config"
  chmod +x "$WORK/bin/pkg-config"
  (cd "$WORK" && tar xzf "$bundle/pyfuse3.tar.gz" && cd pyfuse3-* \
    && "$PY" setup.py build_ext -b "$WORK/site" > "$WORK/pyfuse3-build.log" 2>&1 \
    && cp src/pyfuse3/*.py "$WORK/site/pyfuse3/") \
    || { tail -20 "$WORK/pyfuse3-build.log"; echo "run.sh: pyfuse3 did not build" >&2; exit 3; }
fi
"$PY" -c 'import ckptfs, ckptfs.cli.main, ckptfs.daemon.mount, ckptfs.store.s3, pyfuse3
print("ready: ckptfs", ckptfs.__version__, "pyfuse3", pyfuse3.__version__)' \
  || { echo "run.sh: the bundle does not import here" >&2; exit 3; }
weed version 2>/dev/null | grep -m1 "^version" || true
cd "$WORK/proj"

if [ "$what" = check ]; then
  echo "== check: a directory store mounted, a file written, read back, unmounted"
  mkdir -p "$WORK/check/store" "$WORK/check/mnt"
  "$PY" -m ckptfs.cli mount "$WORK/check/store" "$WORK/check/mnt" --cache-dir "$WORK/check/cache"
  head -c $((64 << 20)) /dev/urandom > "$WORK/check/data"
  cp "$WORK/check/data" "$WORK/check/mnt/data"
  "$PY" -m ckptfs.cli umount "$WORK/check/mnt"
  rm -rf "$WORK/check/cache"
  "$PY" -m ckptfs.cli mount "$WORK/check/store" "$WORK/check/mnt" --cache-dir "$WORK/check/cache"
  cmp "$WORK/check/data" "$WORK/check/mnt/data" && echo "check: 64 MiB read back identical"
  "$PY" -m ckptfs.cli umount "$WORK/check/mnt"
  exit 0
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  || { echo "run.sh: $PY has no torch" >&2; exit 3; }

step() {  # NAME COMMAND...: run one step, its output also in OUT/NAME.txt; go on if it fails
  local name=$1; shift
  echo "== $name, $(date -u +%T): $*"
  timeout "${STEP_S:-900}" "$@" 2>&1 | tee "$OUT/$name.txt" || echo "run.sh: $name failed"
}
prof=() rprof=() gil=()
if [ "${GIL:-1}" = 1 ]; then gil=(--gil); fi
if [ "${PROFILE:-0}" = 1 ]; then
  mkdir -p "$OUT/prof"
  prof=(--profile "$OUT/prof")
  rprof=(--profile "$OUT/prof" --py-spy "$(command -v py-spy)")
fi
runs() { [ "$what" = "$1" ] || [ "$what" = all ] || [ "$what" = quick ]; }
if runs bench; then
  step bench "$PY" scripts/bench.py --gib "${GIB:-1}" --runs "${RUNS:-3}" \
    --targets "${TARGETS:-local,trivial,raw-s3,ck-s3,ck-dir}" "${gil[@]}" "${prof[@]}"
fi
if runs ranks; then
  step ranks "$PY" scripts/bench_scale.py ranks --mib "${RANK_MIB:-256}" --ranks "${RANKS:-8}" \
    --runs "${RANK_RUNS:-1}" --targets "${RANK_TARGETS:-local,trivial,ck-s3}" "${gil[@]}" \
    "${rprof[@]}"
fi
if runs cold-read; then
  variants=() vargs=()
  IFS='|' read -ra variants <<< "${VARIANTS-|--fetch-threads 16}"
  if [ ${#variants[@]} = 0 ]; then variants=(""); fi
  for v in "${variants[@]}"; do vargs+=(--variant "$v"); done
  step cold-read "$PY" scripts/bench_cold_read.py --gib "${READ_GIB:-1}" \
    --runs "${READ_RUNS:-3}" "${vargs[@]}"
fi
if runs fast; then
  step fast "$PY" scripts/bench.py --gib "${FAST_GIB:-1}" --runs "${FAST_RUNS:-3}" \
    --targets ck-fast,ck-s3 ${FAST_DIR:+--fast-tier-dir "$FAST_DIR"}
fi
echo "== end, $(date -u +%T); FUSE mounts now: $(awk '$3 ~ /^fuse/ {print $2}' /proc/mounts | tr '\n' ' ')"
