#!/bin/sh
# The Dockerfile runs each of its pip steps through this (`docker/pip_env.sh COMMAND...`), so
# pip's settings live in one place: pip trusts the CA bundle of the build secret `pip_cert`
# (mounted at /run/ttf-build/pip-cert.pem for that step only, never stored in a layer) when
# one is given, uses the build arg PIP_MIRROR as its index when set, and keeps no cache.
set -eu
if [ -s /run/ttf-build/pip-cert.pem ]; then export PIP_CERT=/run/ttf-build/pip-cert.pem; fi
if [ -n "${PIP_MIRROR:-}" ]; then export PIP_INDEX_URL="$PIP_MIRROR"; fi
export PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=60
exec "$@"
