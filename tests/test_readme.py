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
