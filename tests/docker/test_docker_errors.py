"""Clear errors from docker/*.sh: no engine, an engine that cannot run containers here (naming
which of podman's three settings is missing), a build that cannot reach the package index."""
import os
import shutil

import pytest
from container_engine import DOCKER, engine_name, script

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("containers")]  # one image, one build: one process


def test_no_engine_says_how_to_get_one(tmp_path):
    # A PATH with every usual tool but docker, podman and apt-get.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            if name not in ("docker", "podman", "apt-get") and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(os.path.join(folder, name))
    proc = script("build.sh", env={"PATH": str(bin_dir)})
    assert proc.returncode == 1, proc.stdout
    assert "[build] error: no container engine: install Docker, or podman and runc" in proc.stdout, proc.stdout


def test_a_docker_client_without_an_engine_is_named(tmp_path):
    if engine_name() == "docker" or not shutil.which("docker"):
        pytest.skip("needs a docker client with no engine behind it (as on this project's machines)")
    proc = script("build.sh", env={"TTF_ENGINE": "docker"})
    assert proc.returncode == 1 and "TTF_ENGINE=docker, but no Docker engine answers" in proc.stdout, proc.stdout


@pytest.mark.parametrize("setting, env, message", [
    ("the ulimits", {"TTF_CONTAINERS_CONF": "EMPTY_CONF"}, "'default_ulimits = []' under [containers]"),
    ("the runtime", {"TTF_OCI_RUNTIME": "crun"}, "--runtime runc"),
    ("runc installed", {"TTF_OCI_RUNTIME": "/nonexistent/runc"}, "is not installed"),
])
def test_podman_without_one_of_its_three_settings_says_which(image, tmp_path, setting, env, message):
    if engine_name() != "podman":
        pytest.skip("podman's settings")
    if env.get("TTF_OCI_RUNTIME") == "crun" and not shutil.which("crun"):
        pytest.skip("crun is not installed")
    empty_conf = tmp_path / "containers.conf"
    empty_conf.write_text("[containers]\n")
    env = {k: str(empty_conf) if v == "EMPTY_CONF" else v for k, v in env.items()}
    proc = script("run.sh", "-h", env=env, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "podman cannot start a container here" in proc.stdout and message in proc.stdout, proc.stdout[-3000:]
    if setting == "the runtime":
        assert "hybrid cgroup" in proc.stdout


def test_a_build_that_cannot_reach_the_package_index_says_so(image):
    # A closed port on this machine as the index: the pip layer cannot be served from the cache.
    proc = script("build.sh", "--pip-mirror", "http://127.0.0.1:9/simple", timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "the build could not reach the Python package index" in proc.stdout, proc.stdout[-3000:]
    assert "--pip-mirror" in proc.stdout
