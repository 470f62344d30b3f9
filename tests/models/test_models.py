"""DeepFM and Wide&Deep in native, TFRA and ttf form: they train, share their dense start,
and the training CLI runs end to end."""
import gzip
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ttf
from models import ctr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ctr.ModelSpec(model="fm", embedding_dim=8, mlp=(32, 16), native_buckets=1000)
# TFRA 0.8.1 installs only on TF 2.16: elsewhere its path is skipped with the one-line reason.
PATHS = [pytest.param(p, marks=pytest.mark.skipif(p == "tfra" and bool(ctr.tfra_missing()), reason=str(ctr.tfra_missing())))
         for p in ctr.PATHS]


def batches(n_batches=30, batch_size=256):
    sample = ttf.data.SyntheticCriteo(vocab_per_field=300, key_weight_std=1.0).generate(n_batches * batch_size, seed=5)
    for i in range(n_batches):
        s = slice(i * batch_size, (i + 1) * batch_size)
        yield {"ids": tf.constant(sample["ids"][s]), "dense": tf.constant(sample["dense"][s])}, tf.constant(sample["label"][s])


@pytest.mark.parametrize("model", ["fm", "wdl"])
@pytest.mark.parametrize("path", PATHS)
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


ANY = ttf.data.Schema([ttf.data.Label("y"), ttf.data.Categorical("user"), ttf.data.Categorical("item"),
                       ttf.data.MultiHot("tags"), ttf.data.MultiHot("seen", separator=";", combiner="sum")],
                      delimiter=",", header=True, name="any")


@pytest.mark.parametrize("path", PATHS)
def test_each_path_learns_a_schema_with_multi_hot_fields_and_no_dense(path):
    spec = ctr.spec_for(ANY, model="fm", embedding_dim=8, mlp=(32, 16), native_buckets=1000)
    assert spec.num_fields == 2 and spec.num_dense == 0 and spec.multi_hot == (("tags", "mean"), ("seen", "sum"))
    config = ttf.data.Synthetic(schema=ANY, vocab_per_field=200, key_weight_std=1.0)
    data = list(ttf.data.synthetic_dataset(256 * 30, 256, config, seed=5, num_epochs=3))
    net = ctr.build(spec, path, seed=1)
    opt = ctr.make_optimizer(path, "adam", 0.01)

    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, net.logits(features, training=True)))
        grads = tape.gradient(loss, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables))
        return loss

    losses = [float(step(f, y)) for f, y in data]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.05, (losses[:10], losses[-10:])
    features, _ = data[0]
    empty = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int64), tf.zeros([256], tf.int64))
    probs = net({**features, "tags": empty, "seen": empty}).numpy()  # empty lists: a zero row, no NaN
    assert np.all(np.isfinite(probs))


def test_dense_part_starts_identical_across_paths():
    features, _ = next(batches(1, 8))
    weights = {}
    paths = [p for p in ctr.PATHS if not (p == "tfra" and ctr.tfra_missing())]
    for path in paths:
        net = ctr.build(SMALL, path, seed=7)
        net(features)
        weights[path] = {w.name.split("/", 1)[1]: w.numpy() for w in net.dense_linear.weights + net.deep_out.weights
                         + [v for layer in net.hidden for v in layer.weights]}
    for path in paths[1:]:
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
                     "--data", "sample", "--metrics-out", str(out), "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[train] step 10:" in proc.stdout and "global steps/sec" in proc.stdout
    metrics = json.loads(out.read_text())
    assert metrics["steps"] == 30 and metrics["path"] == "ttf" and metrics["cluster"] == "single"
    assert metrics["global_steps_per_sec"] > 0 and 0 <= metrics["auc"] <= 1 and metrics["logloss"] > 0
    # Resuming from the checkpoint continues the global step instead of starting over.
    proc = run_train("--model", "fm", "--tiacc", "--steps", "40", "--batch-size", "32", "--log-every", "10",
                     "--data", "sample", "--metrics-out", str(out), "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout and "at step 30" in proc.stdout
    assert json.loads(out.read_text())["steps"] == 40


def test_tfra_path_says_why_it_cannot_run_in_one_line():
    reason = ctr.tfra_missing()
    if tf.__version__.startswith("2.16."):
        assert reason is None  # requirements-tf2.16.txt installs TFRA 0.8.1
        return
    assert "TensorFlow 2.16" in reason and "TTF_TF=2.16" in reason and "\n" not in reason
    with pytest.raises(RuntimeError, match="needs TensorFlow 2.16"):
        ctr.build(SMALL, "tfra")
    proc = run_train("--tfra", "--steps", "1", timeout=120)
    assert proc.returncode == 2 and reason in proc.stderr


def test_train_cli_bad_usage_exits_2():
    proc = run_train("--model", "xyz", timeout=120)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    proc = run_train("--data", "/no/such/file.tsv", timeout=120)
    assert proc.returncode == 2 and "data file not found: /no/such/file.tsv" in proc.stderr
    proc = run_train("--ps-hosts", "127.0.0.1:1", timeout=120)
    assert proc.returncode == 2 and "needs all of --ps-hosts" in proc.stderr


def test_train_cli_default_is_synthetic_data_with_its_best_auc_and_quiet(tmp_path):
    out = tmp_path / "metrics.json"
    args = ("--model", "wdl", "--tiacc", "--steps", "20", "--batch-size", "64", "--synthetic-rows", "4000",
            "--cache-dir", str(tmp_path / "cache"), "--metrics-out", str(out))
    proc = run_train(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[train] data: 4,000 synthetic criteo rows" in proc.stdout and "written in" in proc.stdout
    assert "on 800 eval rows (best achievable AUC 0." in proc.stdout
    metrics = json.loads(out.read_text())
    assert 0.6 < metrics["best_auc"] < 1.0 and metrics["eval_rows"] == 800
    # TensorFlow's start-up lines (cuDNN/cuFFT/cuBLAS factories, TensorRT, CPU features) are not shown.
    for noise in ("cuDNN", "cuFFT", "cuBLAS", "TensorRT", "cpu_feature_guard", "WARNING"):
        assert noise not in proc.stderr + proc.stdout, noise
    again = run_train(*args, "--verbose")
    assert again.returncode == 0 and "cached in" in again.stdout
    # --verbose brings them back: "I tensorflow/..." (TF 2.16) or absl's "I0000 00:00:..." (TF 2.21)
    assert re.search(r"^[IW]0000 | [IW] tensorflow/", again.stderr, re.M), again.stderr[-2000:]


def test_train_cli_avazu_schema_on_synthetic_data(tmp_path):
    proc = run_train("--model", "fm", "--tiacc", "--schema", "avazu", "--steps", "20", "--batch-size", "64",
                     "--synthetic-rows", "3000", "--cache-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "synthetic avazu rows" in proc.stdout and "best achievable AUC" in proc.stdout


def test_train_cli_data_errors_are_one_line_and_exit_2(tmp_path, capsys):
    from models import train

    good = open(os.path.join(ROOT, "data", "criteo_sample.txt")).read().splitlines()
    cases = {}
    (tmp_path / "columns.csv").write_text("\n".join(good[:30] + ["1,2,3"] + good[30:]) + "\n")
    cases["columns.csv"] = "columns.csv:31: bad criteo line: has 3 columns, the schema declares 40"
    (tmp_path / "dense.csv").write_text("\n".join(good[:5] + ["0,x" + good[5][good[5].index(",", 2):]]) + "\n")
    cases["dense.csv"] = "dense.csv:6: bad criteo line: dense column I1 is not a number: 'x'"
    (tmp_path / "empty.csv").write_text("")
    cases["empty.csv"] = "empty.csv: empty file, no data lines"
    (tmp_path / "cut.csv.gz").write_bytes(gzip.compress("\n".join(good).encode())[:900])
    cases["cut.csv.gz"] = "cut.csv.gz: truncated gzip file"
    (tmp_path / "adir").mkdir()
    cases["adir"] = "adir holds no data files"  # a folder is its part files; this one has none
    for name, message in cases.items():
        code = train.main(["--tiacc", "--steps", "5", "--batch-size", "16", "--data", str(tmp_path / name)])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (name, err)
    assert train.main(["--tiacc", "--steps", "5", "--batch-size", "16", "--data", str(tmp_path / "columns.csv"),
                       "--eval-data", str(tmp_path / "columns.csv"), "--lenient"]) == 0
    assert "[data] skipped 1 bad line(s)" in capsys.readouterr().out
    # The whole CLI: one line on stderr, no traceback.
    proc = run_train("--data", str(tmp_path / "dense.csv"), "--steps", "5", timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [f"[train] error: {tmp_path / 'dense.csv'}:6: bad criteo line: dense "
                                                "column I1 is not a number: 'x' (fix the file or --schema, or pass "
                                                "--lenient to skip and count bad lines)"]


def test_train_cli_non_finite_run_stops_with_one_clear_line(tmp_path):
    """A run whose updates blow up (a huge lr: the weights overflow, every later loss is
    NaN/Inf) used to spin for ever at the same step; it now skips, counts and stops."""
    proc = run_train("--model", "fm", "--tiacc", "--lr", "1e30", "--steps", "1000", "--batch-size", "32",
                     "--log-every", "1", "--max-non-finite-steps", "5", "--data", "sample", timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[train] error: 5 training steps in a row" in proc.stdout, proc.stdout[-2000:]
    assert "skipped as non-finite" in proc.stdout  # the progress lines count the skips
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    proc = run_train("--lr", "nan", timeout=120)
    assert proc.returncode == 2 and "--lr must be a finite number > 0, got nan" in proc.stderr


def test_train_cli_counts_skipped_steps_and_runs_several_steps_per_call(tmp_path):
    out = tmp_path / "metrics.json"
    proc = run_train("--model", "wdl", "--tiacc", "--precision", "bf16", "--steps", "10", "--steps-per-call", "4",
                     "--log-every", "5", "--batch-size", "32", "--data", "sample", "--metrics-out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(out.read_text())
    # calls of 4, 4 and 2 steps; progress lines where a call crossed a multiple of 5
    assert metrics["skipped_steps"] == 0 and metrics["steps"] == 10 and metrics["bf16_fraction"] == 1.0
    assert "[train] step 8:" in proc.stdout and "[train] step 10:" in proc.stdout
    assert metrics["cpu_seconds_per_step"] > 0


@pytest.mark.slow
def test_start_all_cluster_runs_from_the_venv_named_by_ttf_venv(tmp_path):
    venv = tmp_path / "elsewhere"
    venv.symlink_to(os.path.join(ROOT, ".venv"))
    proc = subprocess.run([os.path.join(ROOT, "start_all.sh"), "--tiacc", "--fm", "--steps", "6", "--batch-size", "16",
                           "--data", "sample"], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TTF_VENV": str(venv)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"checking {venv}" in proc.stdout and "[train] done: 6 steps" in proc.stdout
    assert "unbound variable" not in proc.stderr


def test_start_all_help_and_bad_flag():
    script = os.path.join(ROOT, "start_all.sh")
    proc = subprocess.run([script, "-h"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--tiacc" in proc.stdout and "--role R" in proc.stdout
    proc = subprocess.run([script, "--bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown option '--bogus'" in proc.stderr
    proc = subprocess.run([script, "--role", "ps"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--role needs --ps-hosts" in proc.stderr


def test_train_cli_table_capacity_is_rows_or_bytes(capsys):
    """--table-capacity: a bare integer is rows, a value with a unit bytes (handed to the tables
    as the size string); a bad value, too small a size, or bytes with --dram-budget is a
    one-line usage error (exit 2)."""
    from models import train

    def options(*flags):
        return train.parse_args(["--tiacc", *flags]).table.layer_options()

    assert options("--table-capacity", "1000000")["capacity"] == 1_000_000
    assert options("--table-capacity", "256M")["capacity"] == "256M"
    assert options("--table-capacity", "1.5G", "--evict-policy", "lfu")["capacity"] == "1.5G"
    assert options()["capacity"] == 0
    for flags, message in [
        (["--table-capacity", "12Q"], "--table-capacity must be rows (an integer >= 0, 0: unbounded) or bytes with a "
                                      "unit K, M, G or T (e.g. 512M, 2G), got '12Q'"),
        (["--table-capacity", "-5"], "--table-capacity must be rows"),
        (["--table-capacity", "1K"], "--table-capacity 1K (1024 bytes) is below one row for each of a table's 16 "
                                     "lock shards (244 bytes a row with adam's slots): give at least 3904"),
        (["--table-capacity", "64M", "--dram-budget", "64M", "--ssd-dir", "/tmp"],
         "--table-capacity 64M (bytes) with --dram-budget"),
    ]:
        with pytest.raises(SystemExit) as exited:
            train.parse_args(["--tiacc", *flags])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and message in err and "Traceback" not in err, err
    with pytest.raises(SystemExit):
        train.parse_args(["--table-capacity", "64M"])  # without --tiacc
    assert "--table-capacity and --evict-policy ttl bound ttf tables: add --tiacc" in capsys.readouterr().err


def test_train_cli_table_rows(capsys):
    """--table-rows reaches the tables, with every topology and with the DRAM + SSD tier; without
    --tiacc it is a one-line usage error."""
    from models import train

    assert train.parse_args(["--tiacc", "--table-rows", "int8"]).table.layer_options()["rows"] == "int8"
    assert train.parse_args(["--tiacc"]).table.layer_options()["rows"] == "fp32"
    # a parameter-server cluster, publishing and the disk tier take compressed rows
    # (tests/distribute/test_ps_rows.py, tests/serving/test_int8_rows.py, tests/embedding/test_table_tiers.py)
    for flags in (["--ps-hosts", "127.0.0.1:1", "--worker-hosts", "127.0.0.1:2", "--chief-host", "127.0.0.1:3"],
                  ["--publish-dir", "/tmp/x"], ["--dram-budget", "64M", "--ssd-dir", "/tmp"]):
        assert train.parse_args(["--tiacc", "--table-rows", "int8", *flags]).table.rows == "int8"
    for flags, message in [
        (["--table-rows", "bf16"], "--table-rows bf16 stores ttf tables' rows: add --tiacc"),
    ]:
        with pytest.raises(SystemExit) as exited:
            train.parse_args(flags)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and message in err and "Traceback" not in err, err


def test_train_progress_says_when_the_disk_index_crowds_out_dram(tmp_path, capfd):
    """A tiered table whose disk index takes over half a lock shard's share of the budget says so
    once on stderr, whatever TF_CPP_MIN_LOG_LEVEL hides (train.py sets it to 3), counts the
    shard in tier_stats' crowded_shards, and train.py's progress line says it too."""
    from models import train
    from ttf._ops import ops

    def progress(budget, keys):
        table = ttf.embedding.EmbeddingTable(4, num_shards=1, dram_budget=budget, ssd_dir=str(tmp_path))
        ids = np.arange(keys, dtype=np.int64) * 7919
        for start in range(0, keys, 1024):  # as Adam rows, 1,024 at a time: the rest go to disk
            chunk = ids[start:start + 1024]
            ops().ttf_table_apply_adam(table.resource_handle, chunk, np.zeros((len(chunk), 4), np.float32),
                                       0.0, 0.9, 0.999, 1e-7, 1)
        return train.tier_progress([table.tier_stats()], table.dram_budget), table.tier_stats()["crowded_shards"]

    crowded, shards = progress("64K", 8192)  # ~8,000 disk keys: an index of ~90 KiB
    assert shards == 1
    assert re.search(r"rows \d+ DRAM \+ [1-9]\d* disk, .*; the disk index takes \d{5} of the 65536 bytes of "
                     r"--dram-budget, leaving few rows in DRAM: raise --dram-budget$", crowded), crowded
    warned = capfd.readouterr().err
    assert warned.count("ttf warning: the SSD tier's key index of a table shard takes") == 1, warned
    roomy, shards = progress("4M", 8192)
    assert shards == 0
    assert "rows 8192 DRAM + 0 disk" in roomy and "raise --dram-budget" not in roomy, roomy
    assert "ttf warning" not in capfd.readouterr().err
