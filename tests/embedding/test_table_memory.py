"""Saving and restoring a table needs little memory beyond the table itself: the export's
outputs (about 1x the table) and no more than 1.2x in all; the import about one shard."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_export_and_import_peak_memory():
    # A fresh process, so its peak RSS measures only this table (benchmarks/table_memory.py).
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "table_memory.py"), "--keys", "2000000",
                          "--json"], capture_output=True, text=True, check=True, timeout=1800)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["export_ratio"] <= 1.2, result
    assert result["import_ratio"] <= 0.5, result
