#!/usr/bin/env bash
# The test command: ./test.sh runs the quick tests; ./test.sh --all adds the slow ones
# (cluster start-up, 10M-key tables, fault injection, Horovod jobs; --all installs horovod). Extra arguments go to pytest.
# Sets itself up on first use (./.venv, pinned packages, op build).
# Env: TTF_TF=2.16 tests on TensorFlow 2.16 instead of the newest (in ./.venv-tf2.16; see setup_env.sh);
#        TTF_TF=2.22 on the 2.22 release candidate, Keras 3 only (no tf-keras: one Keras 3 run, below).
#      TTF_TEST_PROCESSES: test processes run at once (default 2; 0 = all in this process, as plain pytest).
#        Each test file runs whole in one of them (its module fixtures once); most tests keep one core busy
#        or wait on servers, so the second process uses the second core (measured times: .ci/run).
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup_env.sh
venv=${TTF_VENV:-$PWD/.venv${TTF_TF:+-tf$TTF_TF}}
marker=()
processes=${TTF_TEST_PROCESSES:-2}
parallel=()
[ "$processes" = 0 ] || parallel=(-n "$processes" --dist loadgroup)
if [ "${1:-}" = "--all" ]; then
  marker=(-m "slow or not slow"); shift
  # The Horovod tests run real horovod (built once, then from pip's wheel cache); on a TensorFlow
  # horovod does not build against, they skip with the reason setup_horovod.sh printed (exit 3).
  hvd_status=0
  ./scripts/setup_horovod.sh || hvd_status=$?
  [ "$hvd_status" = 0 ] || [ "$hvd_status" = 3 ] || exit "$hvd_status"
fi
# Test paths among the arguments (a file, a folder, or file::test); the rest are pytest options.
paths=0
for arg in "$@"; do
  case $arg in -*) ;; *) [ -e "${arg%%::*}" ] && paths=1 ;; esac
done
# Two pytest runs, one per Keras (a process's tf.keras is one or the other): the tf_keras set,
# then tests/keras3 with TF_USE_LEGACY_KERAS unset. Extra arguments go to the first run only; given
# test paths, only the first run (TTF_TEST_KERAS=3 ./test.sh tests/keras3/... runs just the Keras 3 one).
if [ "${TTF_TEST_KERAS:-}" = 3 ]; then
  [ "$paths" = 1 ] || set -- "$@" tests/keras3
  exec env -u TF_USE_LEGACY_KERAS "$venv/bin/python" -m pytest -q "${parallel[@]}" "${marker[@]}" "$@"
fi
# No tf_keras (TensorFlow 2.22 has none): one Keras 3 run, tests/keras3 and the files that do not
# depend on the Keras (tests/conftest.py's ANY_KERAS); its header says why the rest is skipped.
if ! "$venv/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("tf_keras") is None)'; then
  [ "$paths" = 1 ] || set -- "$@" tests
  exec env -u TF_USE_LEGACY_KERAS "$venv/bin/python" -m pytest -q "${parallel[@]}" "${marker[@]}" "$@"
fi
status=0
"$venv/bin/python" -m pytest -q "${parallel[@]}" "${marker[@]}" "$@" || status=$?
if [ "$paths" = 0 ]; then
  echo "[test] Keras 3 tests (tests/keras3, TF_USE_LEGACY_KERAS unset)"
  env -u TF_USE_LEGACY_KERAS TTF_TEST_KERAS=3 "$venv/bin/python" -m pytest -q "${parallel[@]}" "${marker[@]}" tests/keras3 || status=$?
fi
exit "$status"
