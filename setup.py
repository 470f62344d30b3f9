"""Builds every C++ source in ops/ into one TensorFlow op library, ttf/_ttf_ops.tf<X.Y>.so.

The compiler is the system g++ with the flags TensorFlow reports through tf.sysconfig, so
the library matches the installed TensorFlow's ABI. A library loads only in the TensorFlow
minor it was built for (TF 2.16 .. 2.22 are supported; 2.22 as its release candidate), so its name carries that minor and
builds for two versions coexist in one checkout (ttf/_ops.py loads the running one's). Objects are compiled in parallel and
only when their source (or any header in ops/) changed, so a rebuild after a one-file edit
takes one compile and a link:

    python setup.py build_ext --inplace      # what scripts/setup_env.sh runs after edits
    pip install --no-build-isolation -e .    # editable install (also builds)
    pip install --no-build-isolation .       # into an env that has TensorFlow: builds against it
    scripts/build_wheel.sh [OUTDIR]          # a manylinux wheel for the installed TensorFlow minor

Plain `pip install .` builds in an isolated env with the newest supported TensorFlow, so its
library fits only that TensorFlow; --no-build-isolation builds against the one installed.
"""
import concurrent.futures
import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB_NAME = "ttf._ttf_ops"


def _tf_minor(version):
    return ".".join(version.split(".")[:2])


def _tf_flags():
    try:
        import tensorflow as tf
    except ImportError as err:
        sys.exit(
            "ttf: building the ops needs TensorFlow's headers, but TensorFlow is not importable "
            f"({err}). Install it first (TensorFlow 2.16 .. 2.22): pip install -r requirements.txt"
        )
    return tf.__version__, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()


class BuildOps(build_ext):
    """Compiles ops/**/*.cc with g++ and links them into one shared library."""

    def get_ext_filename(self, ext_name):
        # ttf/_ttf_ops.tf2.21.so: no Python ABI tag (tf.load_op_library needs none), the TF minor.
        return os.path.join(*ext_name.split(".")) + f".tf{_tf_minor(_installed_tf_version())}.so"

    def build_extension(self, ext):
        cxx = os.environ.get("CXX", "g++")
        if shutil.which(cxx) is None:
            sys.exit(f"ttf: the C++ compiler '{cxx}' was not found. Install g++ (Debian: apt-get install g++).")
        tf_version, compile_flags, link_flags = _tf_flags()
        # Portable code: no -march=native, so the library runs on any x86-64 the TF wheel runs on.
        # -fno-math-errno: sqrt needs no errno check, so the optimizer loops (Adam, Adagrad) vectorize
        # (the same IEEE results: sqrt is exact to the last bit either way).
        cflags = ["-O3", "-fno-math-errno", "-fPIC", "-Wall", "-Wno-sign-compare", "-Wno-unused-function",
                  f'-DTTF_TF_VERSION="{tf_version}"'] + compile_flags
        obj_dir = os.path.join(ROOT, "build", "ops_obj", "tf" + tf_version)  # one set per TF release
        os.makedirs(obj_dir, exist_ok=True)
        headers = glob.glob(os.path.join(ROOT, "ops", "**", "*.h"), recursive=True)
        newest_header = max((os.path.getmtime(h) for h in headers), default=0.0)

        def compile_one(src):
            src = os.path.join(ROOT, src)
            obj = os.path.join(obj_dir, os.path.relpath(src, ROOT).replace(os.sep, "_") + ".o")
            if os.path.exists(obj) and os.path.getmtime(obj) >= max(os.path.getmtime(src), newest_header):
                return obj
            print(f"ttf: compiling {os.path.relpath(src, ROOT)}", flush=True)
            cmd = [cxx, "-c", src, "-o", obj] + cflags
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"compiling {src} failed:\n{proc.stderr}")
            return obj

        jobs = int(os.environ.get("TTF_BUILD_JOBS", os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            try:
                objects = list(pool.map(compile_one, ext.sources))
            except RuntimeError as err:
                sys.exit(f"ttf: {err}")
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = out + ".tmp"
        link = [cxx, "-shared", "-o", tmp] + objects + link_flags
        proc = subprocess.run(link, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"ttf: linking {out} failed:\n{proc.stderr}")
        os.replace(tmp, out)  # atomic: a running process never sees half a library
        print(f"ttf: built {os.path.relpath(out, ROOT)} for TensorFlow {tf_version}", flush=True)


def _installed_tf_version():
    """The installed TensorFlow's version, from its package metadata when it has it (importing
    TensorFlow takes seconds, and pip runs this file three times per build)."""
    for dist in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return _tf_flags()[0]


# The TensorFlow range ttf builds against (pyproject.toml's build requirement says the same), and the
# newest minor with a tf-keras: 2.22 has none (Keras 3 only; docs/versions.md).
TF_RANGE = "tensorflow>=2.16,<2.23"
LAST_TF_KERAS_MINOR = (2, 21)


def _requirements():
    """What the package (and so each wheel) requires: the TensorFlow range, NumPy, and tf-keras only
    for a minor that has one (tf-keras pins its own minor, so pip picks the installed TF's). Declaring
    tf-keras under 2.22 would make pip refuse the install: every tf-keras asks for TF 2.21 or older.
    pyarrow: ttf.data reads Parquet through it."""
    minor = tuple(int(p) for p in _tf_minor(_installed_tf_version()).split("."))
    return [TF_RANGE, "numpy", "pyarrow>=14"] + (["tf-keras>=2.16,<2.22"] if minor <= LAST_TF_KERAS_MINOR else [])


def _version():
    """ttf's version with the TensorFlow minor its op library is built for as the local label
    (0.1.0+tf2.21): one wheel per TensorFlow minor, each named for it, as the library inside is."""
    with open(os.path.join(ROOT, "ttf", "__init__.py")) as f:
        base = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
    return f"{base}+tf{_tf_minor(_installed_tf_version())}"


sources = sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "ops", "**", "*.cc"), recursive=True)
)
setup(
    version=_version(),
    install_requires=_requirements(),
    ext_modules=[Extension(LIB_NAME, sources=sources)],
    cmdclass={"build_ext": BuildOps},
)
