"""DeepFM's dense part, one training step in bfloat16 vs float32, and a precision timeline.

Part 1 (speed): the dense part of DeepFM -- MLP 400-400-400-1 over [B, 26*16 + 13] plus the
FM second-order term over the embeddings [B, 26, 16] -- forward, backward (down to the
embeddings, as in training) and an Adam update of the dense weights. The float32 and
bfloat16 variants are the same Keras model; the bfloat16 one runs under
ttf.precision.low_precision (weights stay float32, cast inside the step). Both are traced
once, then timed interleaved (the order alternates per repetition); medians are reported.

Part 2 (timeline): a toy CTR task trained with the "loss" policy through
ttf.precision.make_train_step, with a burst of corrupted labels (a loss jump) and one
NaN batch injected; writes a PNG of the loss and the precision per step and prints the
test AUC next to a float32 run of the same task.

Example:
    python benchmarks/precision_dense.py                       # both parts, defaults
    python benchmarks/precision_dense.py --reps 7 --steps 20 --no-timeline
"""
import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import ttf  # noqa: E402,F401  (selects tf_keras)
from ttf.precision import AdaptivePrecision, low_precision, make_train_step  # noqa: E402

FIELDS, DIM, DENSE = 26, 16, 13


class FMSecondOrder(tf.keras.layers.Layer):
    """0.5 * sum_d ((sum_f e_fd)^2 - sum_f e_fd^2): [B, F, D] -> [B, 1] (Rendle 2010)."""

    def call(self, emb):
        square_of_sum = tf.square(tf.reduce_sum(emb, axis=1))
        sum_of_square = tf.reduce_sum(tf.square(emb), axis=1)
        return 0.5 * tf.reduce_sum(square_of_sum - sum_of_square, axis=1, keepdims=True)


def dense_part(hidden=(400, 400, 400)):
    emb = tf.keras.Input((FIELDS, DIM), name="emb")
    dense = tf.keras.Input((DENSE,), name="dense_features")
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(emb), dense])
    for units in hidden:
        h = tf.keras.layers.Dense(units, activation="relu")(h)
    logit = tf.keras.layers.Add()([tf.keras.layers.Dense(1)(h), FMSecondOrder()(emb)])
    return tf.keras.Model([emb, dense], logit)


def make_step(model, optimizer, low):
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def step(emb, dense, labels):
        with tf.GradientTape() as tape:
            tape.watch(emb)
            if low:
                with low_precision(model):
                    logits = model([emb, dense], training=True)
            else:
                logits = model([emb, dense], training=True)
            loss = bce(labels, tf.cast(logits, tf.float32))
        grads = tape.gradient(loss, [emb] + model.trainable_variables)
        optimizer.apply_gradients(zip(grads[1:], model.trainable_variables))
        return loss, grads[0]  # the embedding gradient is an output, as in training

    return step


def machine():
    from _results import machine as host
    return (f"{host()}\nPython {platform.python_version()}, TensorFlow {tf.__version__}, "
            f"tf_keras {tf_keras.__version__}, numpy {np.__version__}, "
            f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(default)')}")


def bench_speed(args):
    rng = np.random.default_rng(0)
    emb = tf.constant(rng.standard_normal((args.batch, FIELDS, DIM)).astype(np.float32) * 0.05)
    dense = tf.constant(rng.standard_normal((args.batch, DENSE)).astype(np.float32))
    labels = tf.constant((rng.random((args.batch, 1)) < 0.25).astype(np.float32))
    steps = {}
    for name, low in (("float32", False), ("bfloat16", True)):
        tf.keras.utils.set_random_seed(0)
        model = dense_part()
        steps[name] = make_step(model, tf.keras.optimizers.Adam(1e-4), low)
        for _ in range(args.warmup):  # trace + warm caches
            steps[name](emb, dense, labels)[0].numpy()
    times = {name: [] for name in steps}
    for rep in range(args.reps):
        order = list(steps) if rep % 2 == 0 else list(reversed(steps))
        for name in order:
            start = time.perf_counter()
            for _ in range(args.steps):
                loss, _ = steps[name](emb, dense, labels)
            loss.numpy()
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"\nDeepFM dense part, batch {args.batch}, MLP 400-400-400 + FM over [B, {FIELDS}, {DIM}], "
          f"fwd+bwd+Adam; {args.reps} interleaved reps x {args.steps} steps")
    print(f"{'variant':<10} {'median ms/step':>15} {'min':>8} {'max':>8} {'examples/s':>12}")
    for name in steps:
        print(f"{name:<10} {med[name]:>15.2f} {min(times[name]):>8.2f} {max(times[name]):>8.2f} "
              f"{args.batch / med[name] * 1e3:>12.0f}")
    paired = [f / b for f, b in zip(times["float32"], times["bfloat16"])]
    print(f"bfloat16 speed-up over float32: {med['float32'] / med['bfloat16']:.2f}x (ratio of medians), "
          f"{statistics.median(paired):.2f}x (median of per-repetition ratios), "
          f"{min(times['float32']) / min(times['bfloat16']):.2f}x (ratio of minima)")
    return med


def toy_data(rng, size, inputs=32):
    weights = rng.standard_normal((inputs, 1)) / np.sqrt(inputs)
    features = rng.standard_normal((size, inputs)).astype(np.float32)
    logits = 2.0 * features @ weights + np.sin(3 * features[:, :1]) * features[:, 1:2]
    labels = (rng.random((size, 1)) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return features, labels


def toy_model(inputs=32):
    tf.keras.utils.set_random_seed(1)
    x = tf.keras.Input((inputs,))
    h = tf.keras.layers.Dense(64, activation="relu")(x)
    h = tf.keras.layers.Dense(64, activation="relu")(h)
    return tf.keras.Model(x, tf.keras.layers.Dense(1)(h))


def timeline(args):
    rng = np.random.default_rng(0)
    features, labels = toy_data(rng, 40960)
    train_x, train_y, test_x, test_y = features[:32768], labels[:32768], features[32768:], labels[32768:]
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    batch = 128
    spike_steps = range(args.toy_steps // 2, args.toy_steps // 2 + 5)
    nan_step = (3 * args.toy_steps) // 4
    runs = {}
    for name in ("float32", "loss"):
        model = toy_model()
        if name == "loss":
            policy = AdaptivePrecision("loss", warmup_steps=50, calm_steps=10, hold_steps=50,
                                       interval=250, interval_hold=10)
        else:
            policy = AdaptivePrecision("time", start_step=10**9)
        step_fn = make_train_step(model, bce, tf.keras.optimizers.Adam(3e-3), policy)
        record = []
        for step in range(args.toy_steps):
            start = (step * batch) % len(train_x)
            x, y = train_x[start:start + batch], train_y[start:start + batch]
            if step in spike_steps:
                y = 1.0 - y  # corrupted labels: a loss jump
            if step == nan_step:
                y = np.full_like(y, np.nan)
            out = step_fn(x, y)
            record.append((float(out["loss"]), bool(out["low_precision"]), bool(out["skipped"])))
        metric = tf.keras.metrics.AUC(num_thresholds=2000)
        metric.update_state(test_y, tf.sigmoid(model(test_x)))
        runs[name] = (record, float(metric.result()), policy)
    record, auc_loss, policy = runs["loss"]
    auc_fp32 = runs["float32"][1]
    low = sum(r[1] for r in record)
    print(f"\nToy CTR task, {args.toy_steps} steps of {batch}, 'loss' policy; label burst at steps "
          f"{spike_steps.start}-{spike_steps.stop - 1}, NaN labels at step {nan_step}")
    print(f"test AUC float32 {auc_fp32:.4f}  loss-policy {auc_loss:.4f}  diff {auc_loss - auc_fp32:+.4f}; "
          f"bf16 steps {low}/{len(record)}; skipped {sum(r[2] for r in record)}; switch {policy.switch.state()}")
    if args.no_plot:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)")
        return
    steps = np.arange(len(record))
    losses = np.array([r[0] for r in record])
    modes = np.array([r[1] for r in record])
    fig, (ax_loss, ax_mode) = plt.subplots(2, 1, sharex=True, figsize=(10, 5), height_ratios=(3, 1))
    ax_loss.plot(steps, np.where(np.isfinite(losses), losses, np.nan), lw=0.8, label="loss")
    ax_loss.fill_between(steps, 0, 1, where=modes, transform=ax_loss.get_xaxis_transform(),
                         color="tab:green", alpha=0.15, label="bfloat16 step")
    for step, r in enumerate(record):
        if r[2]:
            ax_loss.axvline(step, color="tab:red", lw=1, label="NaN loss: update skipped")
    ax_loss.set_ylabel("training loss")
    ax_loss.legend(loc="upper right")
    ax_loss.set_title(f"ttf.precision 'loss' policy on a toy CTR task: AUC {auc_loss:.4f} vs float32 {auc_fp32:.4f}")
    ax_mode.step(steps, modes.astype(int), where="post", color="tab:green")
    ax_mode.set_yticks([0, 1], ["fp32", "bf16"])
    ax_mode.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python benchmarks/precision_dense.py --reps 5 --steps 10",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--batch", type=int, default=4096, help="examples per step")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions per variant")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repetition")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first (trace, caches)")
    parser.add_argument("--toy-steps", type=int, default=1000, help="steps of the timeline's toy run")
    parser.add_argument("--png", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "precision_timeline.png"), help="timeline PNG path")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed comparison")
    parser.add_argument("--no-timeline", action="store_true", help="skip the toy timeline run")
    parser.add_argument("--no-plot", action="store_true", help="run the timeline but write no PNG")
    args = parser.parse_args(argv)
    for name in ("batch", "reps", "steps", "toy_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    print(machine())
    print("command: python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])))
    if not args.no_speed:
        bench_speed(args)
    if not args.no_timeline:
        timeline(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
