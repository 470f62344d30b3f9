"""make_train_step / use_adaptive_precision: one trace per variant, bf16 math, skipped updates,
a toy task where the "loss" policy matches float32 AUC, and the same step on a parameter server's
worker."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from ttf.precision import AdaptivePrecision, low_precision, make_train_step, use_adaptive_precision


def mlp(seed=0, inputs=8, hidden=16):
    tf.keras.utils.set_random_seed(seed)
    x = tf.keras.Input((inputs,))
    h = tf.keras.layers.Dense(hidden, activation="relu")(x)
    h = tf.keras.layers.BatchNormalization()(h)
    h = tf.keras.layers.Dense(hidden, activation="relu")(h)
    return tf.keras.Model(x, tf.keras.layers.Dense(1)(h))


def batch(seed=0, size=64, inputs=8):
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((size, inputs)).astype(np.float32)
    labels = (features[:, :1] + 0.5 * rng.standard_normal((size, 1)) > 0).astype(np.float32)
    return tf.constant(features), tf.constant(labels)


BCE = tf.keras.losses.BinaryCrossentropy(from_logits=True)


def test_each_variant_is_traced_once_over_many_switching_steps():
    model = mlp()
    policy = AdaptivePrecision("loss", warmup_steps=3, calm_steps=1, hold_steps=1, interval=6, interval_hold=2)
    step_fn = make_train_step(model, BCE, tf.keras.optimizers.Adam(1e-3), policy)
    modes = []
    for index in range(60):
        features, labels = batch(seed=index % 5)
        modes.append(bool(step_fn(features, labels)["low_precision"]))
    switches = sum(a != b for a, b in zip(modes, modes[1:]))
    assert switches >= 10, f"the run must switch often to test retracing, switched {switches} times"
    assert step_fn.trace_counts == {"float32": 1, "low": 1}
    assert int(step_fn.step) == 60


def test_trace_for_any_batch_size_makes_one_trace_serve_every_batch_size():
    """A stream's batches vary in size (Horovod ranks must never retrace apart): after
    trace_for_any_batch_size, batches of 64, 7 and 1 rows run the one trace, with the same
    results as a step that traced for each (reference: a second model, same seed and data)."""
    def run(traced_first):
        model = mlp()
        step_fn = make_train_step(model, BCE, tf.keras.optimizers.Adam(1e-3))
        if traced_first:
            step_fn.trace_for_any_batch_size(*batch(size=3))
        before = dict(step_fn.trace_counts)
        losses = [float(step_fn(*batch(seed=i, size=size))["loss"]) for i, size in enumerate([64, 7, 1, 64, 7])]
        return losses, [v.numpy() for v in model.trainable_variables], before, step_fn.trace_counts

    traced, weights, before, after = run(True)
    reference, reference_weights, _, retraced = run(False)
    np.testing.assert_allclose(traced, reference, rtol=1e-5)
    for a, b in zip(weights, reference_weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert before["float32"] >= 1 and after == before  # no step traced again
    assert retraced["float32"] > after["float32"]  # without it, the sizes did retrace (the test can fail)


def _matmul_dtypes(step_fn, features, labels):
    graph = step_fn._function.get_concrete_function(features, labels, None).graph
    dtypes = {}
    for function in graph.as_graph_def().library.function:
        for node in function.node_def:
            if node.op == "MatMul":
                dtypes.setdefault(function.signature.name, set()).add(tf.dtypes.as_dtype(node.attr["T"].type).name)
    return dtypes


def test_low_branch_multiplies_in_bfloat16_and_keeps_float32_weights():
    model = mlp()
    features, labels = batch()
    step_fn = make_train_step(model, BCE, tf.keras.optimizers.SGD(0.1), AdaptivePrecision("time", start_step=0))
    result = step_fn(features, labels)
    assert bool(result["low_precision"]) and result["loss"].dtype == tf.float32
    per_function = _matmul_dtypes(step_fn, features, labels)
    assert {"bfloat16"} in per_function.values()  # the low branch, forward and backward
    assert {"float32"} in per_function.values()  # the float32 branch
    assert all(v.dtype == tf.float32 for v in model.variables)
    # The model is back to float32 outside the traced low branch.
    assert model(features).dtype == tf.float32


def test_low_precision_forward_is_close_to_float32():
    model = mlp()
    features, _ = batch()
    expected = model(features, training=False).numpy()
    with low_precision(model):
        got = model(features, training=False)
    assert got.dtype == tf.bfloat16
    # bfloat16 keeps 8 significant bits (relative error 2^-9 per rounding); three layers
    # of 8-16 term sums stay within a few percent of the output scale.
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), expected, atol=0.05 * np.abs(expected).max())


def _snapshot(model, optimizer):
    return [v.numpy().copy() for v in model.variables + optimizer.variables]


def test_non_finite_loss_skips_the_update_and_touches_no_weight():
    model = mlp()
    optimizer = tf.keras.optimizers.Adam(1e-2)
    policy = AdaptivePrecision("loss", warmup_steps=2, calm_steps=1, hold_steps=3, interval=0)
    step_fn = make_train_step(model, BCE, optimizer, policy)
    features, labels = batch()
    for _ in range(5):
        step_fn(features, labels)
    before = _snapshot(model, optimizer)
    # A NaN label makes the loss NaN (a NaN feature may not: ReLU can map NaN to 0).
    bad_labels = tf.tensor_scatter_nd_update(labels, [[0, 0]], [np.nan])
    result = step_fn(features, bad_labels)
    assert np.isnan(result["loss"].numpy()) and bool(result["skipped"])
    after = _snapshot(model, optimizer)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)  # bit-identical: nothing ran
    # The next steps are float32 (hold) and update again.
    results = [step_fn(features, labels) for _ in range(3)]
    assert not any(bool(r["low_precision"]) for r in results)
    assert not any(bool(r["skipped"]) for r in results)
    assert not np.array_equal(model.variables[0].numpy(), before[0])


def test_plain_callable_model_with_its_own_variables():
    tf.keras.utils.set_random_seed(0)
    kernel = tf.Variable(tf.random.normal((8, 1)) * 0.1)

    def model_fn(features):  # casts its weights to the dtype it is given
        return tf.matmul(features, tf.cast(kernel, features.dtype))

    step_fn = make_train_step(model_fn, BCE, tf.keras.optimizers.SGD(0.5), AdaptivePrecision("time", start_step=1),
                              variables=[kernel])
    features, labels = batch()
    losses = [float(step_fn(features, labels)["loss"]) for _ in range(20)]
    assert losses[-1] < losses[0]
    assert step_fn.trace_counts == {"float32": 1, "low": 1}
    with pytest.raises(ValueError, match="pass the variables"):
        make_train_step(model_fn, BCE, tf.keras.optimizers.SGD(0.5), AdaptivePrecision("time"))


def test_model_fit_hook_switches_per_batch():
    model = mlp()
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss=BCE)
    hook = use_adaptive_precision(model, AdaptivePrecision("time", start_step=3, end_step=6))
    features, labels = batch(size=256)
    seen = []

    class Record(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(logs["low_precision"])

    history = model.fit(features, labels, batch_size=32, epochs=2, verbose=0, callbacks=[Record()], shuffle=False)
    assert seen == [0.0] * 3 + [1.0] * 3 + [0.0] * 10
    assert history.history["loss"][1] < history.history["loss"][0]
    assert hook.trace_counts == {"float32": 1, "low": 1}
    assert int(hook.step) == 16


def _auc(model, features, labels):
    metric = tf.keras.metrics.AUC(num_thresholds=2000)
    metric.update_state(labels, tf.sigmoid(model(features, training=False)))
    return float(metric.result())


def test_loss_policy_reaches_float32_auc_on_a_toy_task():
    rng = np.random.default_rng(0)
    inputs = 32
    weights = rng.standard_normal((inputs, 1)) / np.sqrt(inputs)
    features = rng.standard_normal((24576, inputs)).astype(np.float32)
    logits = 2.0 * features @ weights + np.sin(3 * features[:, :1]) * features[:, 1:2]
    labels = (rng.random((len(features), 1)) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    train_x, test_x = features[:16384], features[16384:]
    train_y, test_y = labels[:16384], labels[16384:]

    results = {}
    for name in ("float32", "loss"):
        model = mlp(seed=1, inputs=inputs, hidden=64)
        policy = AdaptivePrecision(
            "time" if name == "float32" else "loss",
            **({"start_step": 10**9} if name == "float32" else
               {"warmup_steps": 20, "calm_steps": 5, "hold_steps": 20, "interval": 200, "interval_hold": 10}))
        step_fn = make_train_step(model, BCE, tf.keras.optimizers.Adam(3e-3), policy)
        low_steps = 0
        for epoch in range(3):
            for start in range(0, len(train_x), 128):
                out = step_fn(train_x[start:start + 128], train_y[start:start + 128])
                low_steps += int(out["low_precision"])
        results[name] = (_auc(model, test_x, test_y), low_steps)

    auc_fp32, _ = results["float32"]
    auc_loss, low_steps = results["loss"]
    assert auc_fp32 > 0.75, "the toy task must be learnable for the comparison to mean anything"
    assert low_steps > 0.6 * 384, f"only {low_steps} of 384 steps ran in bf16"
    assert abs(auc_loss - auc_fp32) < 0.005, (auc_fp32, auc_loss)


def test_non_finite_gradient_with_finite_loss_skips_and_counts():
    """A finite loss whose gradient is NaN (sqrt at 0) is skipped whole and counted."""
    kernel = tf.Variable([[0.5], [-0.5]])
    optimizer = tf.keras.optimizers.Adam(0.1)

    def model_fn(features):
        return tf.matmul(features, tf.cast(kernel, features.dtype))

    def loss_fn(labels, outputs):  # sqrt(0 * x): loss 0, gradient inf * 0 = NaN
        return tf.reduce_mean(tf.sqrt(outputs * labels))

    step_fn = make_train_step(model_fn, loss_fn, optimizer, variables=[kernel], max_non_finite_steps=0)
    optimizer.build([kernel])
    before = [v.numpy().copy() for v in [kernel] + optimizer.variables]
    result = step_fn(tf.ones((4, 2)), tf.zeros((4, 1)))
    assert float(result["loss"]) == 0.0 and bool(result["skipped"])
    for b, v in zip(before, [kernel] + optimizer.variables):
        np.testing.assert_array_equal(v.numpy(), b)
    assert int(step_fn.skipped_steps) == 1 and int(step_fn.non_finite_run) == 1 and int(step_fn.step) == 1
    result = step_fn(tf.constant([[1.0, 0.0]] * 4), tf.ones((4, 1)))
    assert not bool(result["skipped"]) and int(step_fn.non_finite_run) == 0 and int(step_fn.skipped_steps) == 1
    assert step_fn.trace_counts == {"float32": 1, "low": 0}  # policy None: float32 only


def _table_rows(layer):
    rows = {}
    for table in layer.tables:
        exported = table.export()
        for key, value in zip(exported["keys"].numpy(), exported["values"].numpy()):
            rows[int(key)] = value.copy()
    return rows


def test_non_finite_table_gradient_on_one_shard_skips_every_shard():
    """Keys 0..3 go to shard key % 2; only odd keys (shard 1) get a NaN row gradient. Today's
    fused apply refuses that shard after shard 0 was updated; the step must skip both."""
    import ttf

    layer = ttf.FusedEmbedding(4, num_fields=2, shard_devices=["/cpu:0", "/cpu:0"], name="two_shards")
    ids = tf.constant([[0, 1], [2, 3]], tf.int64)
    layer(ids, training=True)  # creates the rows
    optimizer = ttf.optimizers.Adam(0.1)

    def model_fn(features):
        return layer(features["ids"], training=True)  # [2, 2, 4]

    def loss_fn(labels, emb):
        # Field 1 holds the odd keys: sqrt(0 * e) is 0 in the loss but NaN in the gradient.
        return tf.reduce_sum(emb[:, 0] ** 2) + tf.reduce_sum(tf.sqrt(tf.abs(emb[:, 1]) * labels))

    step_fn = make_train_step(model_fn, loss_fn, optimizer, variables=layer.trainable_variables,
                              max_non_finite_steps=0)
    good = step_fn({"ids": ids}, tf.ones(()))  # every gradient finite: both shards move
    assert not bool(good["skipped"])
    before = _table_rows(layer)
    bad = step_fn({"ids": ids}, tf.zeros(()))
    assert np.isfinite(float(bad["loss"])) and bool(bad["skipped"])
    after = _table_rows(layer)
    assert before.keys() == after.keys() == {0, 1, 2, 3}
    for key in before:  # bit-identical on both shards: value and optimizer slots
        np.testing.assert_array_equal(after[key], before[key], err_msg=f"key {key}")
    assert int(step_fn.skipped_steps) == 1 and int(optimizer.iterations) == 1


def test_non_finite_run_stops_with_a_clear_error():
    from ttf.precision import NonFiniteTrainingError

    model = mlp()
    step_fn = make_train_step(model, BCE, tf.keras.optimizers.SGD(float("nan")), AdaptivePrecision("loss"),
                              max_non_finite_steps=3)
    features, labels = batch()
    step_fn(features, labels)  # the first loss is finite; the NaN lr makes every later one NaN
    step_fn(features, labels)
    step_fn(features, labels)
    with pytest.raises(NonFiniteTrainingError, match=r"3 training steps in a row \(up to step 4\) had a NaN/Inf"):
        step_fn(features, labels)
    assert int(step_fn.skipped_steps) == 3
    with pytest.raises(ValueError, match="max_non_finite_steps must be an int >= 0"):
        make_train_step(model, BCE, tf.keras.optimizers.SGD(0.1), max_non_finite_steps=-1)


def test_run_k_steps_per_call_equals_k_single_calls():
    features, labels = batch(size=96)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(32)  # 3 batches
    single, looped = mlp(seed=4), mlp(seed=4)
    policy = lambda: AdaptivePrecision("time", start_step=1)  # noqa: E731  (fp32, then bf16: both branches)
    step_single = make_train_step(single, BCE, tf.keras.optimizers.Adam(1e-2), policy())
    step_looped = make_train_step(looped, BCE, tf.keras.optimizers.Adam(1e-2), policy())
    for f, y in dataset:
        last = step_single(f, y)
    result = step_looped.run(iter(dataset), 5)  # asks for 5, the data has 3
    assert int(result["steps"]) == 3 and int(step_looped.step) == 3
    np.testing.assert_allclose(float(result["loss"]), float(last["loss"]), rtol=1e-6)
    for a, b in zip(single.variables, looped.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7)
    assert int(step_looped.low_precision_steps) == 2
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        step_looped.run(iter(dataset), 0)


def test_the_step_over_a_parameter_server_strategy_equals_the_one_process_step():
    """docs/precision.md's parameter-server example on real in-process servers: the step runs
    on the worker, its table on the ps; precision per step and the skip are decided there,
    bit-identical to one process on the same batches; a runaway is one NonFiniteTrainingError.
    On Keras 3, which has no ParameterServerStrategy training, the step refuses in one line."""
    if not tf.keras.Model.__module__.startswith("tf_keras."):  # run from tests/keras3/test_precision.py
        model = mlp()
        with pytest.raises(ValueError, match="needs tf_keras: Keras 3 does not train under ParameterServerStrategy"):
            make_train_step(model, tf.keras.losses.MeanSquaredError(), tf.keras.optimizers.SGD(0.1),
                            strategy=tf.distribute.get_strategy())
        return
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ps_train_step.py")
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    # (low precision, skipped) per step: the "time" window is steps 1 and 2; step 3's loss is NaN
    assert found["results"] == [[False, False], [True, False], [True, False], [False, True], [False, False]]
    assert found["table_device"].startswith("/job:ps/")
    for name in ("skipped", "low", "step"):
        assert found["ps"][name] == found["local"][name], name
    np.testing.assert_array_equal(found["ps"]["rows"], found["local"]["rows"])  # same ops, same order
    np.testing.assert_array_equal(found["ps"]["kernel"], found["local"]["kernel"])
    assert found["runaway"].startswith("2 training steps in a row (up to step 7) had a NaN/Inf loss"), found["runaway"]
