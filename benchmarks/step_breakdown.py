"""Where a ttf DeepFM / Wide&Deep training step spends its time, and what the levers buy.

Times each part of the one-process step on its own, in one process, interleaved over
--reps repetitions (median ms per step):

  input         one batch from the Criteo reader (parse + tag + batch), pulled alone
  lookup        the fused table lookup (read-only; new keys read their initial rows)
  dense fwd+bwd the dense part (FM / linear / MLP), forward and backward to the rows,
                in fp32 and in bf16 (under ttf.precision.low_precision, as the step runs it)
  table apply   the fused Adam update of the touched rows
  dense apply   Keras Adam on the dense weights
  switch        the precision policy's decision + loss feed (auto only)
  step          the whole PrecisionTrainStep on in-memory batches (no input)
  loop          the CLI's loop: reader + step, as models/train.py runs it
Keras/TF overhead = step - (lookup + dense fwd+bwd + table apply + dense apply + switch).

Levers (--levers) are timed in the same rotation: the per-step host read of the loss
(the old train.py loop), XLA (jit_compile) on the dense part, and several steps per
tf.function call.

    .venv/bin/python benchmarks/step_breakdown.py --model fm --batch-size 1024
    .venv/bin/python benchmarks/step_breakdown.py --quick        # smoke run
"""
import argparse
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # measured on tf_keras (ttf runs on Keras 3 too)
import ttf  # noqa: E402  (Keras 2 first)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models import ctr  # noqa: E402
from ttf.precision import low_precision  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (same synthetic data files)


def sync(value):
    for t in tf.nest.flatten(value):
        if hasattr(t, "numpy"):
            t.numpy()


def time_ms(fn, inputs, steps):
    """(wall ms, process CPU ms) per call of fn over `steps` calls cycling through inputs.
    CPU time (all threads of this process) is steadier than wall time on a shared machine."""
    for args in inputs:  # warm-up: every input once (traces settle)
        out = fn(*args)
    sync(out)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        out = fn(*inputs[i % len(inputs)])
    sync(out)
    return (time.perf_counter() - start) / steps * 1e3, (time.process_time() - cpu) / steps * 1e3


class Parts:
    """The step's parts for one model, each a tf.function."""

    def __init__(self, args, batches):
        self.args = args
        spec = ctr.ModelSpec(model=args.model)
        self.net = ctr.build(spec, "ttf", seed=0)
        self.opt = ctr.make_optimizer("ttf", "adam", 1e-3)
        self.net(batches[0][0], training=False)
        variables = self.net.trainable_variables
        self.opt.build(variables)
        self.anchor = self.net.sparse.anchor
        self.dense_vars = [v for v in variables if v is not self.anchor]
        self.batches = batches
        bce = lambda y, logits: tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))  # noqa
        self.bce = bce

        self.lookup = tf.function(lambda features, labels: self.net.sparse(features["ids"], training=True))

        def fwd_bwd(low):
            def run(rows, dense, labels):
                with tf.GradientTape() as tape:
                    tape.watch(rows)
                    if low:
                        with low_precision(self.net):
                            logits = self.net.dense_logits(rows, dense)
                    else:
                        logits = self.net.dense_logits(rows, dense)
                    loss = bce(labels, tf.cast(logits, tf.float32))
                return tape.gradient(loss, [rows] + self.dense_vars)
            return run

        self.dense = {p: tf.function(fwd_bwd(p == "bf16")) for p in ("fp32", "bf16")}
        self.dense_xla = {p: tf.function(fwd_bwd(p == "bf16"), jit_compile=True) for p in ("fp32", "bf16")}

        @tf.function
        def grads_of(features, labels):
            with tf.GradientTape() as tape:
                loss = bce(labels, self.net.logits(features, training=True))
            grads = tape.gradient(loss, variables)
            table = grads[variables.index(self.anchor)]
            return table.values, table.indices, [g for g, v in zip(grads, variables) if v is not self.anchor]

        self.rows_inputs, self.table_inputs, self.dense_grad_inputs = [], [], []
        for features, labels in batches:
            rows = self.net.sparse(features["ids"], training=False)
            self.rows_inputs.append((rows, features["dense"], labels))
            values, indices, dense_grads = grads_of(features, labels)
            self.table_inputs.append((values, indices))
            self.dense_grad_inputs.append((dense_grads,))

        lr, step = tf.constant(1e-3), tf.constant(1, tf.int64)

        @tf.function(reduce_retracing=True)
        def table_apply(values, indices):
            return self.net.sparse.apply_gradient(
                tf.IndexedSlices(values, indices), lambda t, k, r: self.opt._apply_table(t, k, r, lr, step))

        self.table_apply = table_apply

        def both_applies(serial):
            @tf.function(reduce_retracing=True)
            def run(values, indices, grads):
                updates = table_apply(values, indices)
                deps = updates if serial else []
                with tf.control_dependencies(deps):
                    return self.opt.apply_gradients(zip(grads, self.dense_vars))
            return run

        self.applies = {"serial": both_applies(True), "concurrent": both_applies(False)}
        self.applies_inputs = [t + d for t, d in zip(self.table_inputs, self.dense_grad_inputs)]
        self.dense_apply = tf.function(lambda grads: self.opt.apply_gradients(zip(grads, self.dense_vars)))
        policy = ttf.precision.policy_for("loss")

        @tf.function
        def switch(loss, step):
            low = policy.low_precision(step)
            return tf.logical_and(low, policy.observe(step, loss))

        self.switch = switch
        self.switch_inputs = [(tf.constant(0.5 + 0.01 * i), tf.constant(i, tf.int64)) for i in range(len(batches))]

    def train_step(self, precision):
        def loss_fn(labels, logits):  # as ttf.distribute.Job's default loss, averaged over the batch
            return tf.reduce_mean(ttf.distribute.sigmoid_cross_entropy(labels, logits))

        return ttf.precision.make_train_step(ctr.Logits(self.net), loss_fn, self.opt,
                                             ttf.precision.policy_for(precision), max_non_finite_steps=20)


def _fm_today(e):  # models/ctr.py: 0.5 * sum_d((sum_f e)^2 - sum_f e^2)
    return 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(e, axis=1)) - tf.reduce_sum(tf.square(e), axis=1), axis=1)


def _fm_flat(e):  # the sum of squares over one contiguous axis
    flat = tf.reshape(e, [tf.shape(e)[0], -1])
    return 0.5 * (tf.reduce_sum(tf.square(tf.reduce_sum(e, axis=1)), axis=1) - tf.reduce_sum(tf.square(flat), axis=1))


def _fm_matmul(e):  # sum over fields as a matmul with stacked identities
    fields, dim = e.shape[1], e.shape[2]
    flat = tf.reshape(e, [-1, fields * dim])
    total = tf.matmul(flat, tf.constant(np.tile(np.eye(dim, dtype=np.float32), (fields, 1))))
    return 0.5 * (tf.reduce_sum(tf.square(total), axis=1) - tf.reduce_sum(tf.square(flat), axis=1))


FM_VARIANTS = {"today": _fm_today, "flat sum of squares": _fm_flat, "matmul": _fm_matmul}


def _fwd_bwd(fm):
    @tf.function
    def run(e):
        with tf.GradientTape() as tape:
            tape.watch(e)
            y = tf.reduce_sum(fm(e))
        return tape.gradient(y, e)
    return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["fm", "wdl"], default="fm", help="(default fm)")
    p.add_argument("--batch-size", type=int, default=1024, help="(default 1024)")
    p.add_argument("--steps", type=int, default=20, help="calls per part per repetition (default 20)")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--rows", type=int, default=400_000, help="synthetic rows of the input file (default 400000)")
    p.add_argument("--levers", action="store_true", help="also time the levers (host read, XLA, steps per call)")
    p.add_argument("--steps-per-call", type=int, default=8, help="k for the steps-per-call lever (default 8)")
    p.add_argument("--only", default=None, help="time only the parts whose name contains one of these (comma list)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_size, args.steps, args.reps, args.rows = 64, 3, 1, 4000
    files = compare.make_data(args.rows, max(args.rows // 8, 1000), 1_000_000, os.path.join(ROOT, "runs", "compare_data"))
    reader = ttf.data.CriteoReader([files["train"]])
    dataset = reader.dataset(args.batch_size, shuffle=True, seed=0, split="all", num_epochs=None)
    batches = [b for b, _ in zip(dataset, range(16))]
    parts = Parts(args, batches)
    steps = {pr: parts.train_step(pr) for pr in ("fp32", "auto")}
    input_iter = iter(dataset)
    loop_iters = {pr: iter(reader.dataset(args.batch_size, shuffle=True, seed=1, split="all", num_epochs=None))
                  for pr in steps}

    def input_part():
        return next(input_iter)

    def loop(precision, host_read):
        step_fn, it = steps[precision], loop_iters[precision]

        def run():
            features, labels = next(it)
            result = step_fn(features, labels)
            if host_read:  # the old loop read the loss every step to feed the switch
                float(result["loss"])
            return result["loss"]
        return run

    timers = {"input": (input_part, [()])}
    timers["lookup"] = (parts.lookup, batches)
    for pr in ("fp32", "bf16"):
        timers[f"dense fwd+bwd {pr}"] = (parts.dense[pr], parts.rows_inputs)
    timers["table apply"] = (parts.table_apply, parts.table_inputs)
    timers["dense apply"] = (parts.dense_apply, parts.dense_grad_inputs)
    timers["switch"] = (parts.switch, parts.switch_inputs)
    for pr in steps:
        timers[f"step {pr}"] = (lambda f, y, s=steps[pr]: s(f, y)["loss"], batches)
        timers[f"loop {pr}"] = (loop(pr, False), [()])
    if args.levers:
        for pr in steps:
            timers[f"loop {pr} + host read per step"] = (loop(pr, True), [()])
            k = args.steps_per_call
            it = iter(reader.dataset(args.batch_size, shuffle=True, seed=2, split="all", num_epochs=None))
            timers[f"loop {pr}, {k} steps per call (per step)"] = (
                lambda s=steps[pr], i=it, k=k: s.run(i, k)["loss"], [()])
        for pr in ("fp32", "bf16"):
            timers[f"dense fwd+bwd {pr}, XLA"] = (parts.dense_xla[pr], parts.rows_inputs)
        emb = [(r[..., :16],) for r, _, _ in parts.rows_inputs]
        for name, fm in FM_VARIANTS.items():
            timers[f"FM term fwd+bwd, {name}"] = (_fwd_bwd(fm), emb)
        for mode, fn in parts.applies.items():
            timers[f"table + dense apply, {mode}"] = (fn, parts.applies_inputs)

    if args.only:
        timers = {n: t for n, t in timers.items() if any(w in n for w in args.only.split(","))}
    results = {name: [] for name in timers}
    for rep in range(args.reps):
        names = list(timers) if rep % 2 == 0 else list(reversed(timers))
        for name in names:
            fn, inputs = timers[name]
            per_call = args.steps_per_call if "steps per call" in name else 1
            wall, cpu = time_ms(fn, inputs, max(args.steps // per_call, 2))
            results[name].append((wall / per_call, cpu / per_call))
        print(f"[breakdown] repetition {rep + 1}/{args.reps} done", flush=True)
    med = {name: statistics.median(w for w, _ in v) for name, v in results.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in results.items()}
    print(render(args, med, cpu))
    return 0


def render(args, med, cpu):
    lines = [f"Model {args.model}, batch {args.batch_size}, ttf path, Adam; median ms per call over {args.reps} "
             f"interleaved repetitions of {args.steps} calls ({platform.node()}, {os.cpu_count()} cores, "
             f"TF {tf.__version__}).", "", "| part | wall ms | CPU ms | CPU share of step fp32 | CPU share of step auto |", "|---|---|---|---|---|"]
    for name, value in med.items():
        fp32 = cpu[name] / cpu["step fp32"] if "step fp32" in cpu and not name.startswith("loop") else float("nan")
        auto = cpu[name] / cpu["step auto"] if "step auto" in cpu and not name.startswith("loop") else float("nan")
        lines.append(f"| {name} | {value:.2f} | {cpu[name]:.2f} | {fp32:.0%} | {auto:.0%} |".replace("nan%", "-"))
    for pr, dense in (("fp32", "dense fwd+bwd fp32"), ("auto", "dense fwd+bwd bf16")) if not args.only else ():
        parts = {t: m["lookup"] + m[dense] + m["table apply"] + m["dense apply"] + (m["switch"] if pr == "auto" else 0)
                 for t, m in (("wall", med), ("cpu", cpu))}
        lines.append(f"| Keras/TF overhead {pr} (step - parts) | {med[f'step {pr}'] - parts['wall']:.2f} | "
                     f"{cpu[f'step {pr}'] - parts['cpu']:.2f} | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
