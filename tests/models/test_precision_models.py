"""--precision loss (what auto runs on a CPU with native bf16) on the real model: same accuracy as fp32
on the bundled sample; auto falls back to fp32 where bf16 is emulated."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "data", "criteo_sample.txt")


def train(precision, tmp_path):
    out = tmp_path / f"{precision}.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "models", "train.py"), "--model", "fm", "--tiacc", "--precision", precision,
         "--steps", "150", "--batch-size", "64", "--data", SAMPLE, "--eval-data", SAMPLE, "--metrics-out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_auto_precision_matches_fp32_auc_on_the_bundled_sample(tmp_path):
    fp32, auto = train("fp32", tmp_path), train("loss", tmp_path)
    assert fp32["bf16_fraction"] == 0.0
    assert auto["bf16_fraction"] > 0.5  # most steps really ran in bf16
    # Evaluated on all 200 rows (49 positives x 151 negatives: 0.001 is about 7 of 7399 pairs).
    assert abs(auto["auc"] - fp32["auc"]) <= 0.001, (auto["auc"], fp32["auc"])


def test_auto_precision_follows_the_cpu(tmp_path):
    import ttf

    metrics = train("auto", tmp_path)
    if ttf.precision.cpu_has_native_bf16():
        assert metrics["precision"] == "loss" and metrics["bf16_fraction"] > 0.5
    else:
        assert metrics["precision"] == "fp32" and metrics["bf16_fraction"] == 0.0


def test_cpu_has_native_bf16_reads_the_flags(tmp_path):
    from ttf.precision._cpu import cpu_has_native_bf16

    zen3, zen4 = tmp_path / "zen3", tmp_path / "zen4"
    zen3.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n")
    zen4.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert not cpu_has_native_bf16(str(zen3)) and cpu_has_native_bf16(str(zen4))
    assert not cpu_has_native_bf16(str(tmp_path / "missing"))
