"""For the container tests: the engine docker/*.sh picks, its CLI as they configure it, and
docker/*.sh themselves."""
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKER = os.path.join(ROOT, "docker")


def engine_name():
    """The engine docker/engine.sh picks: TTF_ENGINE, else docker if its engine answers, else podman."""
    if os.environ.get("TTF_ENGINE"):
        return os.environ["TTF_ENGINE"]
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return "docker"
    return "podman"


def engine_env():
    env = dict(os.environ)
    if engine_name() == "podman":
        env.setdefault("CONTAINERS_CONF", os.path.join(DOCKER, "containers.conf"))
    return env


def run_opts():
    """What docker/engine.sh adds to every `run` (podman: the runc runtime)."""
    return ["--runtime", "runc"] if engine_name() == "podman" else []


def engine(*args, check=True, timeout=120):
    """Runs the engine's CLI (podman as docker/*.sh configure it); returns its stdout."""
    proc = subprocess.run([engine_name(), *args], capture_output=True, text=True, env=engine_env(), timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{engine_name()} {' '.join(args)}: {proc.stderr[-2000:]}"
    return proc.stdout


def script(name, *args, env=None, cwd=ROOT, timeout=1800):
    """Runs docker/<name> to the end; returns the CompletedProcess (stdout and stderr merged)."""
    return subprocess.run([os.path.join(DOCKER, name), *args], cwd=cwd, env={**os.environ, **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
