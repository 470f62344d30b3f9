"""DeepFM and Wide&Deep in native, TFRA and ttf form: they train, share their dense start,
and the training CLI runs end to end."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ttf
from models import ctr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ctr.ModelSpec(model="fm", embedding_dim=8, mlp=(32, 16), native_buckets=1000)


def batches(n_batches=30, batch_size=256):
    sample = ttf.data.SyntheticCriteo(vocab_per_field=300, key_weight_std=1.0).generate(n_batches * batch_size, seed=5)
    for i in range(n_batches):
        s = slice(i * batch_size, (i + 1) * batch_size)
        yield {"ids": tf.constant(sample["ids"][s]), "dense": tf.constant(sample["dense"][s])}, tf.constant(sample["label"][s])


@pytest.mark.parametrize("model", ["fm", "wdl"])
@pytest.mark.parametrize("path", ctr.PATHS)
def test_each_path_learns(model, path):
    spec = ctr.ModelSpec(model=model, embedding_dim=8, mlp=(32, 16), native_buckets=1000)
    net = ctr.build(spec, path, seed=1)
    opt = ctr.make_optimizer(path, "adam", 0.01)

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, net.logits(features, training=True)))
        grads = tape.gradient(loss, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables))
        return loss

    losses = [float(step(f, y)) for _ in range(3) for f, y in batches()]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.05, (losses[:10], losses[-10:])


def test_dense_part_starts_identical_across_paths():
    features, _ = next(batches(1, 8))
    weights = {}
    for path in ctr.PATHS:
        net = ctr.build(SMALL, path, seed=7)
        net(features)
        weights[path] = {w.name.split("/", 1)[1]: w.numpy() for w in net.dense_linear.weights + net.deep_out.weights
                         + [v for layer in net.hidden for v in layer.weights]}
    for path in ("tfra", "ttf"):
        assert weights[path].keys() == weights["native"].keys()
        for name in weights["native"]:
            np.testing.assert_array_equal(weights[path][name], weights["native"][name], err_msg=f"{path} {name}")


def test_bf16_dense_part_tracks_fp32():
    net = ctr.build(SMALL, "ttf", seed=3)
    features, _ = next(batches(1, 64))
    fp32 = net.logits(features, training=False).numpy()
    bf16 = net.logits(features, training=False, compute_dtype=tf.bfloat16).numpy()
    np.testing.assert_allclose(bf16, fp32, atol=0.05)  # bf16 keeps 8 bits of mantissa


def run_train(*args, timeout=600):
    return subprocess.run([sys.executable, os.path.join(ROOT, "models", "train.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_train_cli_single_process_writes_metrics(tmp_path):
    out = tmp_path / "metrics.json"
    proc = run_train("--model", "fm", "--tiacc", "--steps", "30", "--batch-size", "32", "--log-every", "10",
                     "--metrics-out", str(out), "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[train] step 10:" in proc.stdout and "global steps/sec" in proc.stdout
    metrics = json.loads(out.read_text())
    assert metrics["steps"] == 30 and metrics["path"] == "ttf" and metrics["cluster"] == "single"
    assert metrics["global_steps_per_sec"] > 0 and 0 <= metrics["auc"] <= 1 and metrics["logloss"] > 0
    # Resuming from the checkpoint continues the global step instead of starting over.
    proc = run_train("--model", "fm", "--tiacc", "--steps", "40", "--batch-size", "32", "--log-every", "10",
                     "--metrics-out", str(out), "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout and "at step 30" in proc.stdout
    assert json.loads(out.read_text())["steps"] == 40


def test_train_cli_bad_usage_exits_2():
    proc = run_train("--model", "xyz", timeout=120)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    proc = run_train("--data", "/no/such/file.tsv", timeout=120)
    assert proc.returncode == 2 and "data file not found: /no/such/file.tsv" in proc.stderr
    proc = run_train("--ps-hosts", "127.0.0.1:1", timeout=120)
    assert proc.returncode == 2 and "needs all of --ps-hosts" in proc.stderr


def test_train_cli_non_finite_run_stops_with_one_clear_line(tmp_path):
    """A run whose updates blow up (a huge lr: the weights overflow, every later loss is
    NaN/Inf) used to spin for ever at the same step; it now skips, counts and stops."""
    proc = run_train("--model", "fm", "--tiacc", "--lr", "1e30", "--steps", "1000", "--batch-size", "32",
                     "--log-every", "1", "--max-non-finite-steps", "5", timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[train] error: 5 training steps in a row" in proc.stdout, proc.stdout[-2000:]
    assert "skipped as non-finite" in proc.stdout  # the progress lines count the skips
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    proc = run_train("--lr", "nan", timeout=120)
    assert proc.returncode == 2 and "--lr must be a finite number > 0, got nan" in proc.stderr


def test_train_cli_counts_skipped_steps_in_the_metrics(tmp_path):
    out = tmp_path / "metrics.json"
    proc = run_train("--model", "wdl", "--tiacc", "--precision", "fp32", "--steps", "12", "--batch-size", "32",
                     "--metrics-out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(out.read_text())
    assert metrics["skipped_steps"] == 0 and metrics["steps"] == 12 and metrics["bf16_fraction"] == 0.0


def test_start_all_help_and_bad_flag():
    script = os.path.join(ROOT, "start_all.sh")
    proc = subprocess.run([script, "-h"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--tiacc" in proc.stdout and "--role R" in proc.stdout
    proc = subprocess.run([script, "--bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown option '--bogus'" in proc.stderr
    proc = subprocess.run([script, "--role", "ps"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--role needs --ps-hosts" in proc.stderr
