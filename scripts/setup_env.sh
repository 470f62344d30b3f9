#!/usr/bin/env bash
# Sets up ttf in a venv: creates it, installs the pinned requirements, builds the ops.
# Idempotent and fast when nothing changed: later runs only rebuild ops whose sources changed.
# Used by the README's commands (start_all.sh, test.sh) and by docker/Dockerfile.
# --deps-only: the venv and the pinned requirements only (the image's cached layer; the full
# set-up after it finds them installed).
# Env: TTF_TF (TensorFlow minor to set up: unset = the newest, requirements.txt in ./.venv;
#        2.16 = requirements-tf2.16.txt, with TFRA, in ./.venv-tf2.16; both can coexist),
#      PYTHON (interpreter for the venv, default python3), TTF_VENV (overrides the venv path).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${TTF_TF:-}" ]; then
  reqs=requirements-tf$TTF_TF.txt
  [ -f "$reqs" ] || { echo "[setup] TTF_TF=$TTF_TF: no $reqs; choose one of: $(ls requirements-tf*.txt | sed 's/requirements-tf\(.*\)\.txt/\1/' | tr '\n' ' ')(or unset TTF_TF for the newest)" >&2; exit 1; }
  VENV=${TTF_VENV:-$PWD/.venv-tf$TTF_TF}
else
  reqs=requirements.txt
  VENV=${TTF_VENV:-$PWD/.venv}
fi
PY=${PYTHON:-python3}
stamp=$VENV/.ttf-requirements
log=build.log
deps_only=0
[ "${1:-}" = --deps-only ] && deps_only=1
tf_pin=$(grep -E '^tensorflow==' "$reqs" | cut -d= -f3)

run_logged() {  # runs a step quietly; on failure shows the end of its log
  if ! "$@" >"$log" 2>&1; then
    echo "[setup] failed: $*" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

# A venv holding another TensorFlow is made anew: its TFRA, Horovod and op build belong to that one.
if [ -f "$stamp" ] && [ "$(grep -E '^tensorflow==' "$stamp" | cut -d= -f3)" != "$tf_pin" ]; then
  echo "[setup] $VENV holds another TensorFlow than $reqs pins ($tf_pin): recreating it"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  run_logged "$PY" -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || ! cmp -s "$reqs" "$stamp"; then
  echo "[setup] installing $reqs: TensorFlow $tf_pin and the pinned packages (a minute or two)"
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check -r "$reqs"
  cp "$reqs" "$stamp"
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
# One op library per TensorFlow minor (ttf/_ttf_ops.tf2.21.so), so venvs of two versions share
# the checkout. Rebuilt when any file in ops/ is newer than it (incremental, per object).
tf_minor=$(echo "$tf_pin" | cut -d. -f1,2)
lib=ttf/_ttf_ops.tf$tf_minor.so
if [ ! -f "$lib" ] || [ -n "$(find ops -newer "$lib" -type f -print -quit)" ]; then
  echo "[setup] building ttf ops for TensorFlow $tf_pin (g++, $(nproc) jobs)"
  run_logged "$VENV/bin/python" setup.py build_ext --inplace
fi
