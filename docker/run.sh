#!/usr/bin/env bash
# Runs ./start_all.sh inside the ttf image with the given flags:
#   docker/run.sh --tiacc --fm        # the README's main job (a local PS cluster) in one container
#   docker/run.sh -h                  # start_all.sh's flags
# Brings the image up to date first (docker/build.sh: seconds when nothing changed, the whole
# build on first use). The current directory is mounted at the same path, so absolute paths
# under it work for --data, --checkpoint-dir and --metrics-out.
# Env: TTF_ENGINE, TTF_IMAGE (see docker/build.sh -h); TTF_BUILD_FLAGS (extra build.sh flags).
set -euo pipefail
SCRIPT=run
source "$(dirname "$0")/engine.sh"

build_flags=()
read -r -a build_flags <<<"${TTF_BUILD_FLAGS:-}"
"$DOCKER_DIR/build.sh" ${build_flags[@]+"${build_flags[@]}"}
pick_engine no quiet
[ "$ENGINE" = podman ] && check_engine "$IMAGE"

tty=()
[ -t 0 ] && [ -t 1 ] && tty=(-it)
# The engine forwards Ctrl-C and `stop` to start_all.sh, which stops every process it started.
exec "$ENGINE" run --rm ${tty[@]+"${tty[@]}"} "${RUN_OPTS[@]}" -v "$PWD:$PWD" "$IMAGE" "$@"
