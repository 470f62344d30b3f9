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


sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import table_memory  # noqa: E402  (the benchmark whose --quality table and usage errors these check)


def test_quality_table_compares_each_seed_with_fp32s_and_shows_fp32s_spread():
    def m(auc, logloss):
        return {"auc": auc, "logloss": logloss}

    results = {"fp32": {1: m(0.7800, 0.5300), 2: m(0.7810, 0.5290)},
               "bf16": {1: m(0.7790, 0.5310), 2: m(0.7812, 0.5288)},   # within 0.002 / 0.003 on both seeds
               "int8": {1: m(0.7830, 0.5280), 2: m(0.7785, 0.5300)}}   # seed 2: 0.0025 below fp32's AUC
    fp32, bf16, int8 = table_memory.quality_table("adam 0.001", results, [1, 2])
    assert "spread 0.0010 / 0.0010" in fp32
    assert "-0.0004 / +0.0004 (worst -0.0010 / +0.0010)" in bf16 and bf16.endswith("| met |")
    assert "(worst -0.0025 / +0.0010)" in int8 and "**missed**" in int8


@pytest.mark.parametrize("flags, message", [
    (["--formats", "int8,fp32"], "--formats must be fp32 then any of bf16,int8"),
    (["--optimizers", "adam,lamb"], "--optimizers must be a comma list of adam,adagrad,ftrl,sgd"),
    (["--seeds", "1,x"], "--seeds must be a comma list of integers"),
])
def test_quality_usage_errors_are_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        table_memory.main(["--quality", "criteo", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err
