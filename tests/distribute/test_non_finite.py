"""Skipped (NaN/Inf) steps change nothing, on every topology, with one decision for all
shards: ttf.precision.NonFiniteGuard (a step written around strategy.run, as a
parameter-server worker's), the one-process step with new keys in the NaN batch, and a
real parameter-server job stopping on one line."""
import os
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.precision import NonFiniteGuard, NonFiniteTrainingError, make_train_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def table_state(layer):
    """{key: value row + slots} of every shard, and the sorted candidate keys."""
    rows, candidates = {}, []
    for table in layer.tables:
        exported = table.export()
        rows.update({int(k): v.copy() for k, v in zip(exported["keys"].numpy(), exported["values"].numpy())})
        candidates += exported["candidate_keys"].numpy().tolist()
    return rows, sorted(candidates)


def two_shard_model():
    tf.keras.utils.set_random_seed(0)
    layer = ttf.FusedEmbedding(4, num_fields=2, shard_devices=["/cpu:0", "/cpu:0"], name="guarded")
    dense = tf.keras.layers.Dense(1)
    ids = tf.constant([[0, 1], [2, 3]], tf.int64)
    dense(tf.reshape(layer(ids, training=True), [2, 8]))  # creates the rows 0..3 and the kernel
    return layer, dense, ids


def assert_same(before, after):
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_guard_decides_once_before_any_shard_and_skips_whole():
    """Keys 0..3 sit on shard key % 2; only field 1 (odd keys, shard 1) gets a NaN row
    gradient. Without one decision, shard 0 and the dense kernel would move."""
    layer, dense, ids = two_shard_model()
    optimizer = ttf.optimizers.Adam(0.1)
    variables = layer.trainable_variables + dense.trainable_variables
    guard = NonFiniteGuard(max_non_finite_steps=2)
    guard.build(optimizer, variables)

    @tf.function
    def step(poison):
        def replica(poison):
            with tf.GradientTape() as tape:
                emb = layer(ids, training=True)
                # sqrt(0 * e) is 0 in the loss but NaN in field 1's gradient.
                loss = tf.reduce_sum(dense(tf.reshape(emb, [2, 8]))) + tf.reduce_sum(
                    tf.sqrt(tf.abs(emb[:, 1]) * (1.0 - poison)))
            return loss, tape.gradient(loss, variables)
        strategy = tf.distribute.get_strategy()
        loss, grads = strategy.run(replica, args=(poison,))
        return loss, guard.apply_gradients(optimizer, loss, zip(grads, variables), strategy)

    loss, skipped = step(tf.constant(0.0))  # finite: both shards and the kernel move
    assert not bool(skipped) and int(optimizer.iterations) == 1
    rows, _ = table_state(layer)
    dense_before = [v.numpy().copy() for v in dense.variables + optimizer.variables]
    loss, skipped = step(tf.constant(1.0))
    assert np.isfinite(float(loss)) and bool(skipped)
    after, _ = table_state(layer)
    assert rows.keys() == after.keys() == {0, 1, 2, 3}
    for key in rows:  # bit-identical on both shards: value and Adam's slots
        np.testing.assert_array_equal(after[key], rows[key], err_msg=f"key {key}")
    assert_same(dense_before, [v.numpy() for v in dense.variables + optimizer.variables])  # kernel, slots, iterations
    assert int(guard.skipped_steps) == 1
    # The host side counts runs in step order and stops a runaway with the one-process message.
    guard.observe([True, False], first_step=8)  # a finite step ends a run
    guard.observe([True], first_step=10)  # a run goes on across calls
    with pytest.raises(NonFiniteTrainingError, match=r"2 training steps in a row \(up to step 12\) had a NaN/Inf"):
        guard.observe([True, True], first_step=11)
    with pytest.raises(ValueError, match="max_non_finite_steps must be an int >= 0"):
        NonFiniteGuard(-1)


def test_skipped_step_with_new_keys_changes_no_row_count_or_candidate():
    """One process: a NaN step whose batch holds keys never seen leaves the table's export
    (rows, slots, candidates), the optimizer and its step counter exactly as they were."""
    layer = ttf.FusedEmbedding(4, num_fields=2, admission_min_count=0, name="deferred")
    dense = tf.keras.layers.Dense(1)
    model = lambda features: dense(tf.reshape(layer(features, training=True), [-1, 8]))  # noqa: E731
    layer(tf.constant([[0, 1]], tf.int64), training=True)
    dense.build((None, 8))
    optimizer = ttf.optimizers.Adam(0.1)
    step_fn = make_train_step(model, lambda y, p: tf.reduce_mean(p) * y, optimizer,
                              variables=layer.trainable_variables + dense.trainable_variables, max_non_finite_steps=0)
    step_fn(tf.constant([[0, 1]], tf.int64), tf.constant(1.0))
    before = table_state(layer), [t.export()["step"].numpy() for t in layer.tables], int(optimizer.iterations)
    result = step_fn(tf.constant([[5, 6], [7, 8]], tf.int64), tf.constant(float("nan")))
    assert bool(result["skipped"])
    after = table_state(layer), [t.export()["step"].numpy() for t in layer.tables], int(optimizer.iterations)
    assert after[0][0].keys() == before[0][0].keys() == {0, 1}  # no new row
    assert after[0][1] == before[0][1] and after[1:] == before[1:]


POISON_SCHEMA = """{"name": "poison", "delimiter": ",", "header": false,
 "columns": [{"name": "click", "type": "label"}, {"name": "x", "type": "dense", "transform": "none"},
             {"name": "a", "type": "categorical"}, {"name": "b", "type": "categorical"}]}"""


@pytest.mark.slow
def test_parameter_server_job_skips_non_finite_steps_and_stops_on_one_line(tmp_path):
    """A dense value of 3e38 (finite float32) overflows the model: every step is non-finite.
    The PS job skips them (no raw traceback from a shard refusing its NaN rows), runs K steps
    per worker call, and stops after --max-non-finite-steps with one line and exit code 1."""
    schema, data = tmp_path / "poison.json", tmp_path / "poison.csv"
    schema.write_text(POISON_SCHEMA)
    rng = np.random.default_rng(0)
    data.write_text("".join(f"{i % 2},3e38,u{rng.integers(50)},i{rng.integers(50)}\n" for i in range(400)))
    proc = subprocess.run([os.path.join(ROOT, "start_all.sh"), "--tiacc", "--schema", str(schema), "--data", str(data),
                           "--steps", "40", "--batch-size", "16", "--precision", "fp32", "--",
                           "--max-non-finite-steps", "3", "--steps-per-call", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    # Two workers skip concurrently against one counter on the ps, so the global step at the stop
    # depends on timing: at least 3, and short of --steps.
    stopped = re.search(r"\[train\] error: 3 training steps in a row \(up to step (\d+)\) had a NaN/Inf loss or gradient", out)
    assert stopped and 3 <= int(stopped.group(1)) < 40, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
