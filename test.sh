#!/usr/bin/env bash
# The test command: ./test.sh runs the quick tests; ./test.sh --all adds the slow ones
# (cluster start-up, 10M-key tables, fault injection, Horovod jobs; --all installs horovod). Extra arguments go to pytest.
# Sets itself up on first use (./.venv, pinned packages, op build).
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup_env.sh
marker=()
if [ "${1:-}" = "--all" ]; then
  marker=(-m "slow or not slow"); shift
  ./scripts/setup_horovod.sh  # the Horovod tests run real horovod (built once, then from pip's wheel cache)
fi
exec .venv/bin/python -m pytest -q "${marker[@]}" "$@"
