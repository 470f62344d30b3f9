"""The launchers moved to ttf.launch; their old names (in users' manifests) still run them, warning
once with a DeprecationWarning that names the new module. The collectives' old module names
(ttf.distribute.sync, ttf.distribute.horovod) are the new modules themselves."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_python_m_ttf_distribute_server_runs_the_server_and_warns_once():
    proc = run("-m", "ttf.distribute.server", "-h")
    assert proc.returncode == 0, proc.stderr
    assert "--ps-hosts" in proc.stdout and "python -m ttf.launch.server" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(warnings) == 1 and "ttf.distribute.server is now ttf.launch.server" in warnings[0], proc.stderr


def test_importing_an_old_launcher_name_warns_naming_the_new_module():
    """The warning comes before the new module is imported (hvdrun's imports horovod, absent on
    this TensorFlow); one process for both (each loads TensorFlow)."""
    script = ("import warnings, ttf\n"
              "warnings.simplefilter('error', DeprecationWarning)\n"
              "for old in ('server', 'hvdrun'):\n"
              "    try:\n"
              "        __import__('ttf.distribute.' + old)\n"
              "    except DeprecationWarning as warning:\n"
              "        print(warning)\n")
    proc = run("-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"ttf.distribute.{old} is now ttf.launch.{old}: run `python -m ttf.launch.{old}` "
                                        "(the old name will go)" for old in ("server", "hvdrun")]


def test_python_m_ttf_distribute_hvdrun_runs_hvdrun():
    pytest.importorskip("horovod", reason="horovod builds only against TensorFlow 2.16 (TTF_TF=2.16)")
    proc = run("-m", "ttf.distribute.hvdrun", "-h")
    assert proc.returncode == 0 and "--host-index" in proc.stdout, proc.stderr
    assert proc.stderr.count("DeprecationWarning") == 1 and "ttf.launch.hvdrun" in proc.stderr


def test_the_collectives_old_module_names_are_the_new_modules():
    import ttf.distribute.collectives.sync as new
    import ttf.distribute.sync as old

    assert old is new and old.shard_tables is new.shard_tables
