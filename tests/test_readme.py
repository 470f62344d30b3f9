"""The README's API example runs as written."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_api_example_runs(tmp_path):
    readme = open(os.path.join(ROOT, "README.md")).read()
    example = re.search(r"## The API in 15 lines\n\n```python\n(.*?)```", readme, re.S).group(1)
    assert len(example.strip().splitlines()) <= 16
    script = tmp_path / "example.py"
    script.write_text(example)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ids in the table:" in proc.stdout
    size = int(re.search(r"ids in the table: (\d+)", proc.stdout).group(1))
    assert size > 4096 * 26 * 0.99  # random 40-bit ids, tagged by field: nearly all distinct


def run_job_example(tmp_path):
    """The README's ttf.distribute.Job example, its /tmp folders moved under tmp_path, run twice:
    the second run resumes from the first's checkpoint (nothing left to train) and evaluates
    the same model. Returns the two runs' outputs."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    example = re.search(r"## Your own model on a cluster, batch and online\n.*?```python\n(.*?)```", readme, re.S).group(1)
    assert len(example.strip().splitlines()) <= 22
    script = tmp_path / "job_example.py"
    script.write_text(example.replace('"/tmp/', f'"{tmp_path}/'))
    outs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        outs.append(proc.stdout)
    assert "[ttf] resumed from" in outs[1] and "at step 30" in outs[1], outs[1][-2000:]
    scores = [re.search(r"\{'auc': .*\}", out).group(0) for out in outs]
    assert scores[0] == scores[1] and "'rows': 200" in scores[0], scores
    assert (tmp_path / "ttf_serving" / "1").is_dir()  # the base version the job published
    return outs


def test_readme_job_example_runs(tmp_path):
    run_job_example(tmp_path)


README_MAX_BYTES = 12 * 1024  # a newcomer's five minutes; reference lives in docs/
# Docs that parallel changes add; each link is checked once its file exists.
# Remove a name here when its file lands (the test below says when).
PENDING_DOCS = set()


def test_readme_is_short():
    size = os.path.getsize(os.path.join(ROOT, "README.md"))
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes, over {README_MAX_BYTES}: move reference material to docs/ and link it")


def test_every_local_link_of_the_readme_and_docs_resolves():
    sources = ["README.md", "SECURITY.md", "docker/README.md", "benchmarks/README.md", "benchmarks/RESULTS.md"]
    sources += ["docs/" + name for name in sorted(os.listdir(os.path.join(ROOT, "docs"))) if name.endswith(".md")]
    sources += ["benchmarks/results/" + name for name in sorted(os.listdir(os.path.join(ROOT, "benchmarks", "results")))]
    broken = []
    for source in sources:
        text = open(os.path.join(ROOT, source)).read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # code is not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same file
            path = os.path.normpath(os.path.join(os.path.dirname(source), target.split("#")[0]))
            if path in PENDING_DOCS:
                continue
            if not os.path.exists(os.path.join(ROOT, path)):
                broken.append(f"{source}: {target}")
    assert not broken, "links to files that do not exist: " + "; ".join(broken)
    landed = sorted(p for p in PENDING_DOCS if os.path.exists(os.path.join(ROOT, p)))
    assert not landed, f"{landed} exist now: remove them from PENDING_DOCS so their links are checked"
