#!/usr/bin/env bash
# Sets up ttf in a venv: creates it, installs the pinned requirements, builds the ops.
# Idempotent and fast when nothing changed: later runs only rebuild ops whose sources changed.
# Used by the README's commands (start_all.sh, test.sh) and by docker/Dockerfile.
# --deps-only: the venv and the pinned requirements only (the image's cached layer; the full
# set-up after it finds them installed).
# Env: TTF_TF (TensorFlow minor to set up: unset = the newest release, requirements.txt in ./.venv;
#        2.16 = requirements-tf2.16.txt, with TFRA, in ./.venv-tf2.16; 2.22 = the release candidate,
#        Keras 3 only, Python 3.12, in ./.venv-tf2.22; all can coexist),
#      PYTHON (interpreter for the venv; default python3, or the newer Python a requirements file's
#        "# python: X.Y" line asks for: python3 if new enough, else pythonX.Y, else pyenv's X.Y),
#      TTF_VENV (overrides the venv path).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${TTF_TF:-}" ]; then
  reqs=requirements-tf$TTF_TF.txt
  [ -f "$reqs" ] || { echo "[setup] TTF_TF=$TTF_TF: no $reqs; choose one of: $(ls requirements-tf*.txt | grep -v -- -nodeps | sed 's/requirements-tf\(.*\)\.txt/\1/' | tr '\n' ' ')(or unset TTF_TF for the newest)" >&2; exit 1; }
  VENV=${TTF_VENV:-$PWD/.venv-tf$TTF_TF}
else
  reqs=requirements.txt
  VENV=${TTF_VENV:-$PWD/.venv}
fi
nodeps=requirements-nodeps.txt
[ -n "${TTF_TF:-}" ] && [ -f "requirements-tf$TTF_TF-nodeps.txt" ] && nodeps=requirements-tf$TTF_TF-nodeps.txt
# The interpreter: PYTHON, else python3, unless the requirements file asks for a newer Python.
want_py=$(sed -n 's/^# python: \([0-9][0-9.]*\).*/\1/p' "$reqs" | head -n 1)
py_at_least() {  # py_at_least INTERPRETER X.Y: it runs and is Python X.Y or newer
  "$1" -c "import sys; sys.exit(sys.version_info[:2] < tuple(map(int, '$2'.split('.'))))" 2>/dev/null
}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -z "$want_py" ]; then PY=python3
else
  PY=
  for candidate in python3 "python$want_py" $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$want_py".*/bin/python 2>/dev/null | sort -V -r); do
    if py_at_least "$candidate" "$want_py"; then PY=$candidate; break; fi
  done
  [ -n "$PY" ] || { echo "[setup] $reqs needs Python $want_py or newer: python3 is $(python3 -V 2>&1 | cut -d' ' -f2) and no python$want_py is on PATH or in pyenv; install it, or set PYTHON=/path/to/python$want_py" >&2; exit 1; }
fi
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
if [ -n "$want_py" ] && [ -x "$VENV/bin/python" ] && ! py_at_least "$VENV/bin/python" "$want_py"; then
  echo "[setup] $VENV runs an older Python than $reqs asks for ($want_py): recreating it"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV ($("$PY" -V 2>&1))"
  run_logged "$PY" -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || ! cmp -s "$reqs" "$stamp"; then
  echo "[setup] installing $reqs: TensorFlow $tf_pin and the pinned packages (a minute or two)"
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check -r "$reqs"
  cp "$reqs" "$stamp"
fi
# Test-only clients installed without their dependencies (their pins would replace ours):
# DeepCTR, which tests/accelerate converts and trains (requirements-nodeps.txt); a TensorFlow
# minor with its own list (requirements-tf2.22-nodeps.txt: keras-rs on keras-nightly) uses that.
nodeps_stamp=$VENV/.ttf-requirements-nodeps
if [ -f "$nodeps" ] && { [ ! -f "$nodeps_stamp" ] || ! cmp -s "$nodeps" "$nodeps_stamp"; }; then
  echo "[setup] installing test clients without dependencies ($nodeps)"
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check --no-deps -r "$nodeps"
  cp "$nodeps" "$nodeps_stamp"
fi
[ "$deps_only" = 1 ] && exit 0
# ttf itself, editable: the stamp holds the checkout it points at and its packaging files' checksum, so
# a change of the package's requirements (setup.py, pyproject.toml) reinstalls it with them.
editable_stamp=$VENV/.ttf-editable
editable_id="$PWD $(cat setup.py pyproject.toml | cksum)"
if [ "$(cat "$editable_stamp" 2>/dev/null)" != "$editable_id" ]; then
  echo "[setup] installing ttf (editable) and building its ops"
  run_logged "$VENV/bin/python" -m pip install --disable-pip-version-check --no-build-isolation --no-deps -e .
  echo "$editable_id" >"$editable_stamp"
fi
# One op library per TensorFlow minor (ttf/_ttf_ops.tf2.21.so), so venvs of two versions share
# the checkout. Rebuilt when any file in ops/ is newer than it (incremental, per object).
tf_minor=$(echo "$tf_pin" | cut -d. -f1,2)
lib=ttf/_ttf_ops.tf$tf_minor.so
if [ ! -f "$lib" ] || [ -n "$(find ops -newer "$lib" -type f -print -quit)" ]; then
  echo "[setup] building ttf ops for TensorFlow $tf_pin (g++, $(nproc) jobs)"
  run_logged "$VENV/bin/python" setup.py build_ext --inplace
fi
