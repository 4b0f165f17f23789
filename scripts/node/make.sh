#!/usr/bin/env bash
# Builds .node/: what an offline x86-64 training node needs to run ckptfs's benchmarks
# there (scripts/node/run.sh), with no package registry. Run it on a machine that has
# one, from anywhere in the checkout; re-run it after changing ckptfs (the source is
# packed again, the downloads are kept: delete .node/ to fetch them anew).
#
#   bash scripts/node/make.sh            # then copy the checkout's .node/ to the node
#
# Knobs: PYVER (the node's Python, default 3.12), NODE_DIR (default .node in the checkout),
# BUILD_PY (the Python that builds pyfuse3's wheel, default python$PYVER; with pyenv, e.g.
# BUILD_PY="env PYENV_VERSION=3.12.1 python3.12").
# What it packs (see docs/PERFORMANCE.md, "Measuring on a training node"):
#   wheels/    ckptfs's runtime dependencies for cpPYVER manylinux x86-64 (not the Azure
#              and GCS SDKs: the benchmarks use S3 and the directory store; requests,
#              which the store layer imports, is added), py-spy, and
#              pyfuse3 built here if a python$PYVER is at hand (else pyfuse3.tar.gz, the
#              source of 3.4.0, compiled on the node, with setuptools among the wheels)
#   fuse3.tgz  Debian 12's libfuse3 (library, headers) and fusermount3
#   weed.xz    the SeaweedFS binary the tests use (the S3 server on the node's loopback)
#   proj.tgz   this checkout's ckptfs/, scripts/, tests/ and pyproject.toml
#   run.sh     scripts/node/run.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
PYVER=${PYVER:-3.12}
n=${NODE_DIR:-$root/.node}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$n/wheels"
say() { echo "make.sh: $*"; }
quiet() { grep -v -e '^WARNING: Location' -e '^Looking in' || true; }

# the wheels: ckptfs's dependencies (from pyproject.toml) for the node's Python, and
# requests, which the store layer imports (the Azure and GCS SDKs bring it otherwise);
# pip keeps what is already in wheels/
mapfile -t deps < <(python3 -c '
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
skip = ("pyfuse3", "azure-", "google-")
print("\n".join(d for d in deps if not re.split(r"[<>=!~ \[;]", d)[0].startswith(skip)))')
say "cp${PYVER/./} wheels: ${deps[*]} requests py-spy setuptools"
python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$n/wheels" "${deps[@]}" requests 'py-spy>=0.4' setuptools 2>&1 | quiet

# pyfuse3: a wheel built here for the node's Python, else its source
if ! compgen -G "$n/wheels/pyfuse3-*.whl" >/dev/null && [ ! -f "$n/pyfuse3.tar.gz" ]; then
  # the version the checkout's venv runs (scripts/setup.sh), else the newest known to work
  pyfuse3=$("$root/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("pyfuse3"))' \
    2>/dev/null || echo 3.5.0)
  build=${BUILD_PY:-python$PYVER}
  if $build -c "import sys; assert sys.version.startswith('$PYVER.')" 2>/dev/null \
      && $build -m pip --version >/dev/null 2>&1; then
    say "building pyfuse3 $pyfuse3 with $build (about 2 minutes)"
    $build -m pip wheel -q --no-deps --no-binary=pyfuse3 "pyfuse3==$pyfuse3" -w "$n/wheels" \
      2>&1 | quiet
  else
    # 3.4.0: the last source that builds with its setup.py alone (its C file generated;
    # later ones need Cython and setuptools_scm on the node)
    say "no Python $PYVER here ($build): packing pyfuse3 3.4.0's source, compiled on the node"
    python3 -m pip download -q --no-deps --no-binary=pyfuse3 "pyfuse3==3.4.0" -d "$tmp/sdist" \
      2>&1 | quiet
    cp "$tmp"/sdist/pyfuse3-*.tar.gz "$n/pyfuse3.tar.gz"
  fi
fi

# libfuse3 and fusermount3, from Debian 12's packages
if [ ! -f "$n/fuse3.tgz" ]; then
  say "downloading Debian's libfuse3-3, libfuse3-dev, fuse3"
  mkdir -p "$tmp/deb" "$tmp/fuse3"
  (cd "$tmp/deb" && apt-get download -q libfuse3-3 libfuse3-dev fuse3 >/dev/null)
  for deb in "$tmp"/deb/*.deb; do dpkg-deb -x "$deb" "$tmp/fuse3"; done
  tar czf "$n/fuse3.tgz" -C "$tmp/fuse3" .
fi

# SeaweedFS: the binary the test suite runs
if [ ! -f "$n/weed.xz" ]; then
  weed=$(command -v weed || ls "$root/.venv/bin/weed" 2>/dev/null || true)
  [ -n "$weed" ] || { say "no SeaweedFS binary: run scripts/setup.sh first"; exit 2; }
  say "packing $weed"
  xz -T0 -6 -c "$weed" > "$n/weed.xz"
fi

tar czf "$n/proj.tgz" --exclude=__pycache__ ckptfs scripts tests pyproject.toml
cp scripts/node/run.sh "$n/run.sh"
grep -qx '/.node/' .gitignore 2>/dev/null || say "warning: .node/ is not in .gitignore"
say "$(du -sh "$n" | cut -f1) in $n; on the node, from the directory that holds .node/: bash .node/run.sh"
