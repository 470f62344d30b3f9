#!/usr/bin/env bash
# Installs horovod 0.28.1 into the venv, built from source against its TensorFlow with Gloo
# (no MPI, no PyTorch/MXNet). Only the Horovod shape needs it: `./start_all.sh --hvd` and
# `./test.sh --all` run this; a plain `./start_all.sh` never waits for it.
# The first build takes about 6 minutes on two cores (needs g++ and cmake; cmake comes from
# PyPI when the system has none). pip keeps the built wheel in its cache, so later installs
# (a new venv, a re-run) take seconds. Idempotent: returns at once when horovod is there.
# --deps-only: on top of `setup_env.sh --deps-only` (docker/Dockerfile's cached layer: the
# venv with the pinned packages, before ttf itself is there).
# Exit 3: this TensorFlow is one horovod 0.28.1 does not build against (the line says so).
# Env: TTF_VENV (default ./.venv, or ./.venv-tf$TTF_TF when TTF_TF is set: see setup_env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TTF_VENV:-$PWD/.venv${TTF_TF:+-tf$TTF_TF}}
log=build-horovod.log
deps_only=0
[ "${1:-}" = --deps-only ] && deps_only=1

if [ "$deps_only" = 1 ]; then ./scripts/setup_env.sh --deps-only; else ./scripts/setup_env.sh; fi
# horovod 0.28.1, its last release, is built only against the TensorFlow minors listed here
# (the ones a build was checked on; add one after checking it); elsewhere this says why in
# one line, leaves the reason in the venv for the Horovod tests to skip with, and exits 3.
HOROVOD_TF_MINORS="2.16"
tf_version=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('tensorflow'))")
unsupported=$VENV/.ttf-horovod-unsupported
if ! printf '%s\n' $HOROVOD_TF_MINORS | grep -qx "$(echo "$tf_version" | cut -d. -f1,2)"; then
  echo "Horovod needs TensorFlow $HOROVOD_TF_MINORS: horovod 0.28.1 (its last release) is not known to build against TensorFlow $tf_version (upstream support for TF 2.20 is an open horovod pull request); set up with TTF_TF=2.16" | tee "$unsupported" >&2
  exit 3
fi
rm -f "$unsupported"
if [ -f "$VENV/.ttf-horovod" ] && "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('horovod') is None)"; then
  exit 0
fi
export PATH="$VENV/bin:$PATH"  # the venv's cmake, if it needs one
if ! command -v cmake >/dev/null; then
  echo "[setup] horovod needs cmake: installing it from PyPI into $VENV"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q "cmake<4" >"$log" 2>&1 || {
    echo "[setup] failed to install cmake; install it (apt-get install cmake) and re-run" >&2; tail -n 20 "$log" >&2; exit 1; }
fi
command -v make >/dev/null || {  # horovod's build passes make's arguments to the build tool
  echo "[setup] horovod's build needs make and g++: install them (apt-get install make g++) and re-run" >&2; exit 1; }
echo "[setup] installing horovod 0.28.1 (TensorFlow + Gloo): a source build of about 6 minutes the first" \
     "time, seconds from pip's wheel cache later; log: $log"
if ! HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
     HOROVOD_WITHOUT_MXNET=1 "$VENV/bin/python" -m pip install --disable-pip-version-check --no-build-isolation \
     horovod==0.28.1 >"$log" 2>&1; then
  echo "[setup] failed: building horovod 0.28.1; end of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
check="import ttf, horovod.tensorflow as hvd; hvd.init()"
# --deps-only (an image build): ttf is not there yet, and hvd.init() needs a host name that
# resolves, which a build container may not have; the import loads horovod's TF ops, the check
# that matters here.
[ "$deps_only" = 1 ] && check="import horovod.tensorflow"
if ! "$VENV/bin/python" -c "$check" >>"$log" 2>&1; then
  echo "[setup] horovod installed but does not load with this TensorFlow; end of $log:" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
touch "$VENV/.ttf-horovod"
echo "[setup] horovod ready ($("$VENV/bin/horovodrun" --version 2>/dev/null | tail -n 1))"
