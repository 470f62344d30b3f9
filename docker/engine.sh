# Sourced by docker/build.sh, run.sh and cluster.sh: picks the container engine and knows how
# to make it run containers on this kind of host. Not a command of its own.
#
# The engine: $TTF_ENGINE (docker | podman) if set; else docker when its engine answers
# (`docker info`; a docker client without a daemon does not count), else podman. podman runs
# with three settings that hosts with a hybrid cgroup v1/v2 layout need (measured on the
# machines ttf is tested on): the runc runtime installed (crun refuses that layout),
# `default_ulimits = []` in containers.conf (the default limits are refused) and
# `--runtime runc`. CONTAINERS_CONF points podman at docker/containers.conf, which holds the
# second and names runc too. Env for experts: TTF_CONTAINERS_CONF (another containers.conf),
# TTF_OCI_RUNTIME (default runc).

DOCKER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$DOCKER_DIR")
IMAGE=${TTF_IMAGE:-ttf}
ENGINE=""
RUN_OPTS=()    # options every `run` needs with this engine
BUILD_OPTS=()  # options every `build` needs with this engine

say() { echo "[$SCRIPT] $*"; }
fail() { echo "[$SCRIPT] error: $*" >&2; exit 1; }

engine() { "$ENGINE" "$@"; }

# Installs podman, runc (crun refuses hybrid cgroups) and debootstrap (for the base image) with
# apt-get. $1 = yes: without asking.
install_podman() {
  local how="apt-get install podman runc debootstrap"
  command -v apt-get >/dev/null || fail "no container engine: install Docker, or podman and runc ($how on Debian)"
  if [ "$1" != yes ]; then
    if [ -t 0 ]; then
      read -r -p "[$SCRIPT] no container engine here. Install podman, runc and debootstrap with apt-get now? [y/N] " answer
      [[ $answer =~ ^[Yy] ]] || fail "no container engine: install Docker, or run: $how (or pass --yes)"
    else
      fail "no container engine: install Docker, or run: $how (or pass --yes to let $SCRIPT do it)"
    fi
  fi
  [ "$(id -u)" = 0 ] || fail "installing podman needs root: sudo $how"
  say "installing podman, runc and debootstrap with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null && apt-get install -y -q podman runc debootstrap >/dev/null ||
    fail "apt-get could not install podman runc debootstrap; run it by hand to see why"
}

# Sets ENGINE, RUN_OPTS and BUILD_OPTS. $1 = yes: install podman without asking when no engine;
# $2 = quiet: no note about the choice (build.sh, run first, gave it).
pick_engine() {
  local install=${1:-no} quiet=${2:-} docker_err
  case "${TTF_ENGINE:-}" in
    docker)
      docker_err=$(docker info 2>&1 >/dev/null) ||
        fail "TTF_ENGINE=docker, but no Docker engine answers: ${docker_err##*$'\n'} Start dockerd, or use podman (unset TTF_ENGINE)"
      ENGINE=docker ;;
    podman) command -v podman >/dev/null || install_podman "$install"; ENGINE=podman ;;
    "")
      if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        ENGINE=docker
      else
        command -v docker >/dev/null && [ -z "$quiet" ] && say "docker's client is here but no Docker engine answers (docker info fails): using podman"
        command -v podman >/dev/null || install_podman "$install"
        ENGINE=podman
      fi ;;
    *) fail "TTF_ENGINE must be docker or podman, got '$TTF_ENGINE'" ;;
  esac
  if [ "$ENGINE" = podman ]; then
    export CONTAINERS_CONF=${TTF_CONTAINERS_CONF:-$DOCKER_DIR/containers.conf}
    [ -r "$CONTAINERS_CONF" ] || fail "containers.conf not found: $CONTAINERS_CONF (TTF_CONTAINERS_CONF)"
    local runtime=${TTF_OCI_RUNTIME:-runc}
    RUN_OPTS=(--runtime "$runtime")
    # --network host: the build's RUN steps reach the package indexes the way the host does.
    BUILD_OPTS=(--runtime "$runtime" --network host)
  fi
}

# Runs `true` in image $1; on failure says which of podman's settings is missing.
check_engine() {
  local image=$1 err
  err=$(engine run --rm "${RUN_OPTS[@]}" --network none --entrypoint /bin/true "$image" 2>&1 >/dev/null) && return 0
  local last=${err##*$'\n'} runtime=${TTF_OCI_RUNTIME:-runc}
  [ "$ENGINE" = docker ] && fail "docker cannot start a container: $last"
  case "$err" in
    *"hybrid mode"*|*"cgroups in hybrid"*)
      fail "podman cannot start a container here: the runtime '$runtime' refuses this host's hybrid cgroup" \
           "layout ($last). Use runc: apt-get install runc, and --runtime runc (TTF_OCI_RUNTIME=runc, the default)" ;;
    *rlimit*|*ulimit*)
      fail "podman cannot start a container here: the default ulimits are refused ($last). Set" \
           "'default_ulimits = []' under [containers] in $CONTAINERS_CONF (docker/containers.conf has it)" ;;
    *"no valid executable"*|*"not found"*|*"no such file"*|*"executable file"*)
      fail "podman cannot start a container here: the OCI runtime '$runtime' is not installed ($last)." \
           "Install runc (apt-get install runc) and run with --runtime runc (TTF_OCI_RUNTIME=runc, the default)" ;;
    *) fail "$ENGINE cannot start a container here: $last" ;;
  esac
}

image_exists() { engine image inspect "$1" >/dev/null 2>&1; }
