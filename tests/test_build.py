"""The op build across TensorFlow versions: a library per TF minor, a clear error naming the
rebuild when the running TensorFlow has none, and set-up files that agree on the versions."""
import glob
import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import tomllib

import pytest
import tensorflow as tf

from ttf import _ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_loaded_library_is_named_for_and_built_against_the_running_tensorflow():
    minor = ".".join(tf.__version__.split(".")[:2])
    assert os.path.basename(_ops.LIBRARY_PATH) == f"_ttf_ops.tf{minor}.so"
    assert _ops.ops().ttf_build_info().numpy().decode() == tf.__version__


def test_a_missing_library_names_the_versions_built_and_how_to_rebuild(monkeypatch):
    monkeypatch.setattr(_ops, "LIBRARY_PATH", os.path.join(os.path.dirname(_ops.LIBRARY_PATH), "_ttf_ops.tf9.99.so"))
    with pytest.raises(ImportError) as err:
        _ops.ops.__wrapped__()  # the uncached loader: the real lookup, against a version not built
    message = str(err.value)
    assert "_ttf_ops.tf9.99.so" in message and "is missing" in message
    built = re.search(r"has builds for TensorFlow ([0-9., ]+) only", message)
    assert built and _ops.TF_MINOR in built.group(1).split(", "), message  # at least the running one's
    assert "./scripts/setup_env.sh" in message and "pip install --no-build-isolation" in message


def test_every_requirements_file_pins_a_tensorflow_inside_the_declared_range():
    """Each requirements file pins a TensorFlow of the range setup.py and pyproject.toml declare, with its
    tf-keras where that minor has one (2.16 .. 2.21) and a Keras 3 and no tf-keras where it has none."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "dependencies" in project["project"]["dynamic"] and "dependencies" not in project["project"]
    setup_py = open(os.path.join(ROOT, "setup.py")).read()
    assert 'TF_RANGE = "tensorflow>=2.16,<2.23"' in setup_py
    assert "tensorflow>=2.16,<2.23" in project["build-system"]["requires"]
    files = [os.path.join(ROOT, "requirements.txt")] + [
        p for p in glob.glob(os.path.join(ROOT, "requirements-tf*.txt")) if not p.endswith("-nodeps.txt")]
    assert len(files) >= 3
    for path in files:
        text = open(path).read()
        tf_pin = re.search(r"^tensorflow==(2\.(\d+)\.\d+(rc\d+)?)$", text, re.M)
        assert tf_pin and 16 <= int(tf_pin.group(2)) <= 22, path
        keras_pin = re.search(r"^tf-keras==(2\.(\d+))\.\d+$", text, re.M)
        if int(tf_pin.group(2)) <= 21:
            assert keras_pin and keras_pin.group(2) == tf_pin.group(2), path  # tf-keras matches TF
        else:  # no tf-keras exists: Keras 3 (keras-nightly, as TF 2.22.0rc0 declares), and never tf-keras
            assert not re.search(r"^tf-keras", text, re.M) and re.search(r"^keras(-nightly)?==3\.", text, re.M), path
        name = os.path.basename(path)
        if name != "requirements.txt":
            assert name == f"requirements-tf2.{tf_pin.group(2)}.txt", path


def test_the_package_requires_tf_keras_only_where_the_running_minor_has_one():
    """The installed ttf's metadata (setup.py's _requirements, computed when it was built here): tf-keras
    for 2.16 .. 2.21, none for 2.22, which has none (declaring it would make pip refuse the install)."""
    # The venv's own record (not the checkout's ttf.egg-info, which the last build of any venv wrote).
    (dist,) = [d for d in importlib.metadata.distributions(path=[sysconfig.get_path("purelib")]) if d.metadata["Name"] == "ttf"]
    requires = dist.requires or []
    minor = tuple(int(p) for p in _ops.TF_MINOR.split("."))
    assert "tensorflow<2.23,>=2.16" in requires or "tensorflow>=2.16,<2.23" in requires, requires
    assert any(r.startswith("tf-keras") for r in requires) == (minor <= (2, 21)), requires


def test_setup_names_the_choices_for_an_unknown_tensorflow_version():
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup_env.sh")], env={**os.environ, "TTF_TF": "9.9"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "TTF_TF=9.9: no requirements-tf9.9.txt; choose one of: 2.16 2.22 (or" in proc.stderr


def test_a_library_built_for_another_tensorflow_raises_naming_the_rebuild(tmp_path):
    """The real mismatch: another TF minor's build (if this checkout has one), loaded under this TF's name."""
    others = [p for p in glob.glob(os.path.join(os.path.dirname(_ops.LIBRARY_PATH), "_ttf_ops.tf*.so"))
              if p != _ops.LIBRARY_PATH]
    if not others:
        pytest.skip("no op library of another TensorFlow minor in this checkout (TTF_TF=2.16 ./scripts/setup_env.sh builds one)")
    code = ("import tensorflow as tf, ttf._ops as o\n"
            f"o.LIBRARY_PATH = {others[0]!r}\n"
            "try:\n    o.ops()\nexcept ImportError as err:\n    print('ImportError:', err)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-3000:]  # an exception, not a crash
    assert "ImportError: ttf:" in proc.stdout and f"Rebuild it for TensorFlow {tf.__version__}" in proc.stdout, proc.stdout


def test_a_wheel_under_another_tensorflow_refuses_in_one_line_naming_the_wheel_it_needs(tmp_path, monkeypatch):
    """An installed wheel (a package folder with no setup.py beside it) holding another minor's library
    only. tests/test_wheel.py checks the same on a real installed wheel (slow)."""
    package = tmp_path / "site-packages" / "ttf"
    package.mkdir(parents=True)
    other = "2.16" if _ops.TF_MINOR != "2.16" else "2.21"  # a minor that is not the running one
    (package / f"_ttf_ops.tf{other}.so").write_bytes(b"")
    monkeypatch.setattr(_ops, "_DIR", str(package))
    monkeypatch.setattr(_ops, "LIBRARY_PATH", str(package / f"_ttf_ops.tf{_ops.TF_MINOR}.so"))
    message = _ops._wheel_mismatch()
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert message.startswith(f"ttf: this ttf wheel is built for TensorFlow {other}, but TensorFlow {tf.__version__} is running; "
                              f"install the wheel built for it, ttf-0.1.0+tf{_ops.TF_MINOR}-{py}-{py}-manylinux_*_x86_64.whl")
    assert "\n" not in message
    (package / f"_ttf_ops.tf{_ops.TF_MINOR}.so").write_bytes(b"")  # the right one present: no complaint
    assert _ops._wheel_mismatch() is None
    monkeypatch.setattr(_ops, "_DIR", os.path.join(ROOT, "ttf"))  # a checkout builds its own: the rebuild message instead
    monkeypatch.setattr(_ops, "LIBRARY_PATH", os.path.join(ROOT, "ttf", "_ttf_ops.tf9.99.so"))
    assert _ops._wheel_mismatch() is None
