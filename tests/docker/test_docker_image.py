"""The image, really built and run: it installs with the README's set-up script, a second build
of the same inputs comes from the layer cache, and docker/run.sh runs the README's main job in
a container with the same result lines as ./start_all.sh."""
import json
import os
import re

import pytest
from container_engine import ROOT, engine, engine_name, run_opts, script

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("containers")]  # one image, one build: one process
DONE = re.compile(r"^\[train\] done: (\d+) steps, [0-9.]+ global steps/sec, AUC ([0-9.]+|nan), "
                  r"logloss [0-9.]+ on (\d+) eval rows( \(best achievable AUC [0-9.]+: the planted model's\))?$", re.M)


def test_a_second_build_comes_from_the_layer_cache(image):
    proc = script("build.sh")
    assert proc.returncode == 0, proc.stdout[-3000:]
    log = open(f"{ROOT}/runs/docker-build.log").read()
    if engine_name() == "podman":
        steps, cached = len(re.findall(r"^STEP \d+/\d+: (RUN|COPY) ", log, re.M)), log.count("Using cache")
    else:
        steps, cached = len(re.findall(r"^#\d+ \[\d+/\d+\] (RUN|COPY) ", log, re.M)), log.count("CACHED")
    assert steps and cached >= steps, log[-3000:]  # nothing rebuilt: the inputs did not change
    assert "[setup]" not in log  # so scripts/setup_env.sh did not run again
    # The image is the README's set-up: start_all.sh as entrypoint, the pinned packages and the
    # ops built by scripts/setup_env.sh.
    config = json.loads(engine("image", "inspect", image))[0]["Config"]
    assert config["Entrypoint"] == ["/opt/ttf/start_all.sh"]
    out = engine("run", "--rm", *run_opts(), "--network", "none", "--entrypoint", "ls", image,
                 "/opt/ttf/ttf/", "/opt/ttf/.venv/.ttf-requirements")
    pin = re.search(r"^tensorflow==(\d+\.\d+)\.", open(os.path.join(ROOT, "requirements.txt")).read(), re.M).group(1)
    assert f"_ttf_ops.tf{pin}.so" in out and ".ttf-requirements" in out  # built for requirements.txt's TensorFlow


def test_run_sh_runs_the_readme_main_job_in_a_container(image, tmp_path):
    metrics = tmp_path / "m.json"  # run.sh mounts the current directory at the same path
    proc = script("run.sh", "--tiacc", "--fm", "--metrics-out", str(metrics), cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    done = DONE.search(proc.stdout)
    assert done, proc.stdout[-3000:]
    result = json.loads(metrics.read_text())
    assert int(done.group(1)) == result["steps"] == 200  # start_all.sh's default
    assert int(done.group(3)) == result["eval_rows"] > 0
    assert result["cluster"] == {"ps": 1, "workers": 2} and result["path"] == "ttf"
    assert "[start_all] servers ready" in proc.stdout and "[start_all] done; logs in runs/" in proc.stdout
