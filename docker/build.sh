#!/usr/bin/env bash
# Builds the ttf image (docker/Dockerfile) with docker or podman; run with -h for every option.
# Layers are cached by the engine: a second build with the same inputs takes seconds, a source
# edit rebuilds from the first changed layer (ops/ or ttf/: the op build; requirements.txt: the
# pinned packages too). Where no registry is reachable the base image is made with debootstrap
# (Debian bookworm minbase) and kept in the engine's storage as localhost/ttf-base:bookworm.
set -euo pipefail
SCRIPT=build
source "$(dirname "$0")/engine.sh"

usage() {
  cat <<'EOF'
Usage: docker/build.sh [options]

Builds the image `ttf` from docker/Dockerfile with docker, or with podman where no Docker
engine answers (podman set up as docker/engine.sh explains).

  --base IMAGE        base image (default: python:3.11-slim-bookworm when the engine has it or
                      can pull it, else a debootstrap-made bookworm, made once and cached)
  --rebuild-base      make the debootstrap base again (e.g. for Debian's updates)
  --ca-bundle FILE    a CA bundle pip must trust during the build (a TLS-inspecting proxy), passed
                      as a build secret, mounted read-only at a path of its own, never stored in
                      the image (default: $PIP_CERT when it names a file; 'none': no bundle)
  --pip-mirror URL    a PyPI mirror (index URL) for the build
  --no-cache          build every layer again
  -y, --yes           where no engine is present, install podman, runc and debootstrap with
                      apt-get without asking (CI, tests)
  -h, --help          this help
Env: TTF_ENGINE (docker | podman), TTF_IMAGE (image name, default ttf), TTF_DEBIAN_MIRROR
(for debootstrap, default http://deb.debian.org/debian).

Examples:
  docker/build.sh                                   # build or update the image ttf
  docker/build.sh --ca-bundle /etc/ssl/certs/ca-certificates.crt
EOF
}

usage_error() { echo "[build] $*" >&2; echo "Run docker/build.sh -h for usage." >&2; exit 2; }

REGISTRY_BASE=docker.io/library/python:3.11-slim-bookworm
DEBOOTSTRAP_BASE=localhost/ttf-base:bookworm
base="" rebuild_base=0 ca_bundle="${PIP_CERT:-}" pip_mirror="" no_cache=0 yes=no
while [ $# -gt 0 ]; do
  case "$1" in
    --base) [ $# -ge 2 ] || usage_error "--base needs a value"; base=$2; shift ;;
    --rebuild-base) rebuild_base=1 ;;
    --ca-bundle) [ $# -ge 2 ] || usage_error "--ca-bundle needs a value"; ca_bundle=$2; shift ;;
    --pip-mirror) [ $# -ge 2 ] || usage_error "--pip-mirror needs a value"; pip_mirror=$2; shift ;;
    --no-cache) no_cache=1 ;;
    -y|--yes) yes=yes ;;
    -h|--help) usage; exit 0 ;;
    *) usage_error "unknown option '$1'" ;;
  esac
  shift
done
[ "$ca_bundle" = none ] && ca_bundle=""
[ -z "$ca_bundle" ] || [ -r "$ca_bundle" ] || usage_error "--ca-bundle: cannot read '$ca_bundle'"

workdir=""
cleanup() { [ -z "$workdir" ] || rm -rf "$workdir"; }
trap cleanup EXIT
trap 'echo "[build] interrupted"; exit 130' INT TERM

# The debootstrap base: Debian bookworm minbase (its python3 is 3.11, as ttf's), with Debian's
# updates and security archives, imported as an image. About 2 minutes, once.
make_debootstrap_base() {
  command -v debootstrap >/dev/null || {
    [ "$yes" = yes ] && command -v apt-get >/dev/null && apt-get install -y -q debootstrap >/dev/null
    command -v debootstrap >/dev/null || fail "making the base image needs debootstrap (apt-get install debootstrap), or pass --base IMAGE"
  }
  [ "$(id -u)" = 0 ] || fail "debootstrap needs root to make the base image; run as root or pass --base IMAGE"
  local mirror=${TTF_DEBIAN_MIRROR:-http://deb.debian.org/debian} t0=$SECONDS
  workdir=$(mktemp -d "${TMPDIR:-/var/tmp}/ttf-base.XXXXXX")
  say "no registry base image: making $DEBOOTSTRAP_BASE with debootstrap (bookworm minbase, about 2 minutes; log $workdir.log)"
  debootstrap --variant=minbase bookworm "$workdir/rootfs" "$mirror" >"$workdir.log" 2>&1 || {
    tail -n 15 "$workdir.log" >&2
    fail "debootstrap could not make the base image from $mirror (log above: $workdir.log); set TTF_DEBIAN_MIRROR or pass --base IMAGE"
  }
  cat >"$workdir/rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
EOF
  rm -rf "$workdir"/rootfs/var/cache/apt/archives/*.deb "$workdir"/rootfs/var/lib/apt/lists/*
  tar -C "$workdir/rootfs" -c . | engine import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$DEBOOTSTRAP_BASE" >"$workdir.log" 2>&1 ||
    { tail -n 5 "$workdir.log" >&2; fail "$ENGINE import of the debootstrap base failed (log above)"; }
  rm -rf "$workdir" "$workdir.log"
  workdir=""
  say "base image $DEBOOTSTRAP_BASE made in $((SECONDS - t0))s"
}

pick_base() {
  if [ -n "$base" ]; then
    image_exists "$base" || engine pull "$base" >/dev/null || fail "base image '$base' is neither here nor pullable"
    return
  fi
  if [ "$rebuild_base" = 1 ]; then make_debootstrap_base; base=$DEBOOTSTRAP_BASE; return; fi
  for candidate in "$REGISTRY_BASE" "$DEBOOTSTRAP_BASE"; do
    if image_exists "$candidate"; then base=$candidate; return; fi
  done
  if timeout 120 "$ENGINE" pull "$REGISTRY_BASE" >/dev/null 2>&1; then base=$REGISTRY_BASE; return; fi
  say "no registry reachable for $REGISTRY_BASE"
  make_debootstrap_base
  base=$DEBOOTSTRAP_BASE
}

# Explains a failed build from its log: which package index could not be reached, and the fix.
explain_failure() {
  local log=$1 line
  if line=$(grep -m1 -E "CERTIFICATE_VERIFY_FAILED|SSLError|certificate verify failed" "$log"); then
    fail "the build could not reach the Python package index: TLS certificate not trusted (${line## }). If your network" \
         "inspects TLS, pass the CA bundle your host's pip uses: --ca-bundle FILE. Build log: $log"
  fi
  if line=$(grep -m1 -E "Could not fetch URL|Failed to establish a new connection|ProxyError|Max retries exceeded|No matching distribution found|Network is unreachable|Connection refused" "$log"); then
    fail "the build could not reach the Python package index (${line## }). Check the network or proxy" \
         "(HTTPS_PROXY is passed to the build), or use a mirror: --pip-mirror URL. Build log: $log"
  fi
  if line=$(grep -m1 -E "Temporary failure resolving|Could not resolve|Failed to fetch|Unable to connect to|Could not connect to" "$log"); then
    fail "the build could not reach Debian's package archive (${line## }); apt-get runs inside the build" \
         "(network: host). Build log: $log"
  fi
  tail -n 25 "$log" >&2
  fail "the image build failed (the end of its log is above; all of it: $log)"
}

pick_engine "$yes"
pick_base
[ "$ENGINE" = podman ] && check_engine "$base"

args=(build "${BUILD_OPTS[@]}" -f "$DOCKER_DIR/Dockerfile" -t "$IMAGE" --build-arg "BASE_IMAGE=$base")
[ -n "$ca_bundle" ] && args+=(--secret "id=pip_cert,src=$ca_bundle")
[ -n "$pip_mirror" ] && args+=(--build-arg "PIP_MIRROR=$pip_mirror")
[ "$no_cache" = 1 ] && args+=(--no-cache)
mkdir -p "$REPO_ROOT/runs"
log=$REPO_ROOT/runs/docker-build.log
say "building image $IMAGE with $ENGINE from $base${ca_bundle:+ (pip trusts $ca_bundle)}; log $log"
t0=$SECONDS
# One line per Dockerfile step on the terminal, everything in the log.
set +e
DOCKER_BUILDKIT=1 engine "${args[@]}" "$REPO_ROOT" 2>&1 | tee "$log" |
  grep --line-buffered -E '^(STEP [0-9]+/[0-9]+|#[0-9]+ \[)|\[setup\]' | sed -u -E 's/^(.{110}).+/\1 .../'
status=${PIPESTATUS[0]}
set -e
[ "$status" = 0 ] || explain_failure "$log"
say "image $IMAGE ready in $((SECONDS - t0))s"
