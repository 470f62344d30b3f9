"""No Docker engine runs here, so check that the image cannot drift from the tested set-up:
it installs with the README's set-up script, runs start_all.sh, and the compose file uses
start_all.sh's multi-host flags."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dockerfile_uses_the_readme_setup_and_entrypoint():
    dockerfile = open(os.path.join(ROOT, "docker", "Dockerfile")).read()
    assert "RUN ./scripts/setup_env.sh" in dockerfile
    assert 'ENTRYPOINT ["./start_all.sh"]' in dockerfile
    assert "./scripts/setup_env.sh" in open(os.path.join(ROOT, "start_all.sh")).read()
    assert "./scripts/setup_env.sh" in open(os.path.join(ROOT, "test.sh")).read()


def test_compose_runs_every_role_with_the_multihost_flags():
    compose = open(os.path.join(ROOT, "docker", "compose.yaml")).read()
    roles = re.findall(r"--role (\w+) --index (\d+)|--role (chief)", compose)
    assert {r[0] or r[2] for r in roles} == {"ps", "worker", "chief"}
    help_text = open(os.path.join(ROOT, "start_all.sh")).read()
    for flag in ("--ps-hosts", "--worker-hosts", "--chief-host", "--role", "--index"):
        assert flag in compose and flag in help_text
