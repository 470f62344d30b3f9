"""models/train.py with --checkpoint-every / --full-every (delta checkpoints) and a resume at
or past --steps, which trains nothing and evaluates the restored model."""
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(*args):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "models", "train.py"), "--model", "wdl", "--tiacc",
                          "--batch-size", "16", "--precision", "fp32", "--log-every", "2",
                          "--data", os.path.join(ROOT, "data", "criteo_sample.txt"), *args],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_delta_chain_resume_and_resume_past_the_end(tmp_path):
    ckpt, first, second = tmp_path / "ckpt", tmp_path / "first.json", tmp_path / "second.json"
    out = train("--steps", "7", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--full-every", "3",
                "--metrics-out", str(first))
    # Saves at 2 (full), 4, 6 (deltas), 7 (full: the chain of 3 is complete).
    assert sorted(os.path.basename(p) for p in glob.glob(str(ckpt / "*.index"))) == ["ckpt-2.index", "ckpt-7.index"]
    out = train("--steps", "10", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--full-every", "3",
                "--metrics-out", str(first))
    assert "resumed from" in out and "at step 7" in out, out
    chain = json.loads((ckpt / "ttf_chain.json").read_text())
    assert chain["full"].endswith("ckpt-7") and [os.path.basename(p) for p in chain["deltas"]] == ["delta-8",
                                                                                                   "delta-10"]
    trained = json.loads(first.read_text())
    assert trained["steps"] == 10 and trained["table_size"] > 0

    for steps in ("10", "5"):  # at and past the end: restore (full + deltas), evaluate, train nothing
        out = train("--steps", steps, "--checkpoint-dir", str(ckpt), "--metrics-out", str(second))
        assert "nothing to train" in out and "[train] done: 10 steps" in out, out
        restored = json.loads(second.read_text())
        assert restored["steps"] == 10 and restored["timed_steps"] == 0
        assert restored["table_size"] == trained["table_size"]
        assert restored["table_checksum"] == trained["table_checksum"]  # every row and slot, bit for bit in the sum
        assert restored["auc"] == trained["auc"] and restored["logloss"] == trained["logloss"]
