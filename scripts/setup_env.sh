#!/usr/bin/env bash
# Sets up ttf in ./.venv: creates the venv, installs the pinned requirements, builds the ops.
# Idempotent and fast when nothing changed: later runs only rebuild ops whose sources changed.
# Used by the README's commands (start_all.sh, test.sh) and by docker/Dockerfile.
# --deps-only: the venv and the pinned requirements only (the image's cached layer; the full
# set-up after it finds them installed).
# Env: PYTHON (interpreter for the venv, default python3), TTF_VENV (default ./.venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TTF_VENV:-$PWD/.venv}
PY=${PYTHON:-python3}
stamp=$VENV/.ttf-requirements
log=build.log
deps_only=0
[ "${1:-}" = --deps-only ] && deps_only=1

run_logged() {  # runs a step quietly; on failure shows the end of its log
  if ! "$@" >"$log" 2>&1; then
    echo "[setup] failed: $*" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  run_logged "$PY" -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || ! cmp -s requirements.txt "$stamp"; then
  echo "[setup] installing pinned requirements: TensorFlow 2.16.2, tf-keras 2.16, TFRA 0.8.1 (a minute or two)"
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check -r requirements.txt
  cp requirements.txt "$stamp"
fi
# Test-only clients installed without their dependencies (their pins would replace ours):
# DeepCTR, which tests/accelerate converts and trains.
nodeps_stamp=$VENV/.ttf-requirements-nodeps
if [ -f requirements-nodeps.txt ] && { [ ! -f "$nodeps_stamp" ] || ! cmp -s requirements-nodeps.txt "$nodeps_stamp"; }; then
  echo "[setup] installing test clients without dependencies (requirements-nodeps.txt: deepctr)"
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check --no-deps -r requirements-nodeps.txt
  cp requirements-nodeps.txt "$nodeps_stamp"
fi
[ "$deps_only" = 1 ] && exit 0
# ttf itself, editable: the stamp holds the checkout it points at.
editable_stamp=$VENV/.ttf-editable
if [ "$(cat "$editable_stamp" 2>/dev/null)" != "$PWD" ]; then
  echo "[setup] installing ttf (editable) and building its ops"
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check --no-build-isolation --no-deps -e .
  echo "$PWD" >"$editable_stamp"
fi
# Rebuild the op library when any file in ops/ is newer than it (incremental, per object).
lib=ttf/_ttf_ops.so
if [ ! -f "$lib" ] || [ -n "$(find ops -newer "$lib" -type f -print -quit)" ]; then
  echo "[setup] building ttf ops (g++, $(nproc) jobs)"
  run_logged "$VENV/bin/python" setup.py build_ext --inplace
fi
