#!/usr/bin/env bash
# Installs everything ckptfs needs on a Debian machine (idempotent): FUSE 3, a virtualenv
# in .venv with ckptfs and its test and lint tools, getfattr (package attr). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v fusermount3 >/dev/null || ! pkg-config --exists fuse3 2>/dev/null \
        || ! command -v getfattr >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-dev pkg-config attr >/dev/null
    else
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-dev pkg-config attr >/dev/null
    fi
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.ckptfs-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test,lint]'
    touch "$stamp"
fi
