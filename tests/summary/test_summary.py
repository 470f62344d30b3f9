"""ttf.summary: the rolling-window AUC against a pairwise NumPy reference, the event files
(read back with tf.data.TFRecordDataset), per-table row counts, and models/train.py --logdir
in one process and (slow) on a local parameter-server cluster."""
import doctest
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import ttf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_TAGS = ["train/loss", "train/auc_window", "train/examples_per_sec", "train/bf16_share", "train/skipped_steps",
              "input/bad_lines", "tables/ttf_sparse/rows", "tables/ttf_sparse/rows_evicted", "eval/auc", "eval/logloss"]


def pairwise_auc(labels, scores):
    """P(score of a positive > score of a negative), ties one half: the definition, O(P x N)."""
    pos, neg = scores[labels > 0.5][:, None], scores[labels <= 0.5][None, :]
    return float(((pos > neg) + 0.5 * (pos == neg)).mean())


@pytest.mark.parametrize("module", [ttf.summary, ttf.summary._scalars], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_rolling_auc_is_the_auc_of_the_last_rows():
    rng = np.random.default_rng(0)
    window = ttf.summary.RollingAUC(capacity=300)
    record = tf.function(window.record)
    labels, logits = [], []
    for batch in (64, 100, 64, 128, 37):  # 393 rows: the ring wraps
        y = (rng.random(batch) < 0.3).astype(np.float32)
        z = (rng.normal(size=batch) + 1.5 * y).astype(np.float32)
        record(tf.constant(y), tf.constant(z[:, None]))  # [B, 1] logits are flattened
        labels.append(y)
        logits.append(z)
    labels, logits = np.concatenate(labels)[-300:], np.concatenate(logits)[-300:]
    probs = tf.sigmoid(logits).numpy()  # float32, as the ring stores them
    # Same scores, same pairs: only float64 summation order differs.
    assert window.auc() == pytest.approx(pairwise_auc(labels, probs), abs=1e-9)
    assert window.rows() == 393


def test_rolling_auc_batch_larger_than_window_keeps_its_last_rows():
    window = ttf.summary.RollingAUC(capacity=4)
    # The first four rows would give AUC 0; the last four give 1.
    window.record(tf.constant([1., 0., 1., 0., 0., 1., 0., 1.]), tf.constant([-3., 3., -3., 3., -1., 1., -2., 2.]))
    assert window.auc() == 1.0


def test_rolling_auc_drops_non_finite_and_is_nan_with_one_class():
    window = ttf.summary.RollingAUC(capacity=16)
    assert np.isnan(window.auc())  # empty
    window.record(tf.constant([1., 1.]), tf.constant([0.5, 2.]))
    assert np.isnan(window.auc())  # positives only
    window.record(tf.constant([0., 0., 1.]), tf.constant([-1., float("nan"), float("nan")]))  # a skipped step's NaN
    assert window.auc() == 1.0  # two positives above the one finite negative
    with pytest.raises(ValueError, match="capacity must be > 0"):
        ttf.summary.RollingAUC(capacity=0)


def test_job_summary_writes_scalars_tensorboard_reads(tmp_path):
    with ttf.summary.JobSummary(tmp_path / "run") as summary:
        summary.scalars({"stream/lag_seconds": 2.5, "publish/sequence": np.int64(7), "left/out": None}, step=10)
        summary.scalars({"stream/lag_seconds": float("nan")}, step=20)
        with pytest.raises(TypeError, match="stream/lag_seconds"):
            summary.scalars({"stream/lag_seconds": "soon"}, step=30)
    found = ttf.summary.read_scalars(tmp_path / "run")
    assert found["publish/sequence"] == [(10, 7.0)]
    assert found["stream/lag_seconds"][0] == (10, 2.5) and np.isnan(found["stream/lag_seconds"][1][1])
    assert "left/out" not in found
    # TensorBoard's scalars plugin picks tensors by this plugin name.
    events = [tf.compat.v1.Event.FromString(r.numpy()) for r in tf.data.TFRecordDataset(
        str(next((tmp_path / "run").glob("events.out.tfevents.*"))))]
    plugins = {v.metadata.plugin_data.plugin_name for e in events for v in e.summary.value if v.HasField("metadata")}
    assert plugins == {"scalars"}


def test_job_summary_non_writer_writes_nothing(tmp_path):
    summary = ttf.summary.JobSummary(tmp_path / "run", writer=False)
    summary.scalars({"train/loss": 0.5}, step=1)
    summary.close()
    assert not (tmp_path / "run").exists()


def test_table_scalars_count_rows_of_every_shard():
    layer = ttf.DynamicEmbedding(4, shard_devices=["/cpu:0"] * 3, name="emb")
    keys = tf.constant(np.arange(0, 500, 3), tf.int64)
    optimizer = ttf.optimizers.SGD(0.1)
    with tf.GradientTape() as tape:  # rows are inserted by the optimizer's apply
        loss = tf.reduce_sum(layer(keys, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
    values = ttf.summary.table_scalars([layer, tf.keras.layers.Dense(1)])  # a layer without tables adds nothing
    assert values == {"tables/emb/rows": ttf.embedding.table_summary(layer)[0], "tables/emb/rows_evicted": 0}
    assert values["tables/emb/rows"] == len(np.arange(0, 500, 3))


def check_run(logdir, metrics, steps):
    found = ttf.summary.read_scalars(logdir)
    assert sorted(found) == sorted(TRAIN_TAGS), sorted(found)
    # One point per progress line, 3 of them (a cluster's warm-up steps come before the first).
    logged = [step for step, _ in found["train/loss"]]
    assert len(logged) == 3 and logged == sorted(logged) and logged[-1] == steps, logged
    assert all(0.2 < loss < 0.8 for _, loss in found["train/loss"])
    # The planted model is learnable: the window's AUC rises above chance.
    assert 0.6 < found["train/auc_window"][-1][1] <= metrics.get("best_auc", 1.0)
    assert all(rate > 0 for _, rate in found["train/examples_per_sec"])
    assert all(0 <= share <= 1 for _, share in found["train/bf16_share"])
    assert all(skipped == 0 for _, skipped in found["train/skipped_steps"])
    rows = [count for _, count in found["tables/ttf_sparse/rows"]]
    assert rows == sorted(rows) and rows[-1] == metrics["table_size"]
    assert found["eval/auc"] == [(steps, pytest.approx(metrics["auc"], abs=1e-6))]


def test_train_logdir_one_process(tmp_path):
    from models import train  # pylint: disable=import-outside-toplevel

    metrics = tmp_path / "m.json"
    code = train.main(["--model", "fm", "--tiacc", "--steps", "120", "--log-every", "40", "--synthetic-rows", "20000",
                       "--cache-dir", str(tmp_path / "cache"), "--logdir", str(tmp_path / "tb"),
                       "--metrics-out", str(metrics)])
    assert code == 0
    check_run(tmp_path / "tb", json.loads(metrics.read_text()), 120)


def test_train_rejects_a_bad_auc_window(tmp_path, capsys):
    from models import train  # pylint: disable=import-outside-toplevel

    with pytest.raises(SystemExit) as exit_info:
        train.parse_args(["--auc-window", "0", "--logdir", str(tmp_path)])
    assert exit_info.value.code == 2 and "--auc-window must be > 0" in capsys.readouterr().err


@pytest.mark.slow
def test_train_logdir_parameter_server_cluster(tmp_path):
    from tests.distribute.test_cluster import finish, start  # pylint: disable=import-outside-toplevel

    metrics = tmp_path / "m.json"
    out = finish(start("--steps", "120", "--synthetic-rows", "20000", "--metrics-out", str(metrics),
                       "--logdir", str(tmp_path / "tb"), "--", "--cache-dir", str(tmp_path / "cache"),
                       "--log-every", "40"))
    assert "[train] done: 120 steps" in out, out[-3000:]
    result = json.loads(metrics.read_text())
    assert result["cluster"] == {"ps": 1, "workers": 2}
    check_run(tmp_path / "tb", result, 120)
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1  # the chief alone writes


def test_rolling_auc_window_survives_a_checkpoint_restore(tmp_path):
    """A job restored from a checkpoint continues its window: the same AUC, after more
    batches, as a window that was never interrupted (the ring and its row count are saved)."""
    rng = np.random.default_rng(3)
    batches = [((rng.random(50) < 0.4).astype(np.float32), rng.normal(size=50).astype(np.float32))
               for _ in range(9)]
    straight = ttf.summary.RollingAUC(capacity=300)
    for y, z in batches:
        straight.record(tf.constant(y), tf.constant(z))
    first = ttf.summary.RollingAUC(capacity=300)
    for y, z in batches[:5]:
        first.record(tf.constant(y), tf.constant(z))
    path = tf.train.Checkpoint(auc_window=first).write(str(tmp_path / "ckpt"))
    resumed = ttf.summary.RollingAUC(capacity=300)
    tf.train.Checkpoint(auc_window=resumed).read(path).assert_consumed()
    for y, z in batches[5:]:
        resumed.record(tf.constant(y), tf.constant(z))
    assert resumed.rows() == straight.rows() == 450
    assert resumed.auc() == straight.auc()  # the same 300 pairs: bit-equal
    fresh = ttf.summary.RollingAUC(capacity=300)  # what a restart without it had: 4 batches, not the last 6
    for y, z in batches[5:]:
        fresh.record(tf.constant(y), tf.constant(z))
    assert fresh.auc() != straight.auc()
