"""A model as its user writes it (Keras Embeddings) vs the same model after
`fast = ttf.accelerate(model)`: training steps/sec, quality after the same training, the
predictions before training, and the stock-TF serving export of the trained model.

Models (--model), each written as its tutorial or library writes it:
  deepfm  DeepCTR's DeepFM (functional, tf_keras), 26 Zipf fields with --vocab ids each,
          13 dense columns, a planted logistic label (ttf.data.SyntheticCriteo); Adam.
  tfrs    TensorFlow Recommenders' ranking tutorial (a tfrs.Model holding a keras.Model
          whose features are Sequential([StringLookup, Embedding]), dim 32, tf_keras);
          Adagrad(0.1), MSE on a planted rating.
  dlrm    keras-io's DLRM tutorial (a Keras 3 keras.Model subclass, a dict of Embeddings
          of dim 8 over about 150k ids, keras_rs DotInteraction); AdamW, MSE.
  dcn     keras-rs' DCN example (Keras 3 functional, FeatureCross); Adam, MSE.
All paths: both models start from the same weights (accelerate carries the rows over) and
train on the same batches in the same order through Keras' own train function (what
model.fit runs), read from memory (the batches are cached by one pass before timing). The
paths alternate (ABBA) in blocks of --steps steps, --repeats times, after --warmup steps each; the
table gives the median steps/sec and its ratio, the median CPU time per step (the whole
process, every thread: what a shared machine's load does not distort) and its ratio, AUC (binary label;
for ratings, the AUC of the score against rating > median) and RMSE (ratings) on held-out
rows, the largest |prediction difference| before training, and the largest |served - model|
of the trained accelerated model's export_for_serving SavedModel (stock TF ops only).

    .venv/bin/python benchmarks/accelerate.py --model deepfm --vocab 100000
    .venv/bin/python benchmarks/accelerate.py --model tfrs
    .venv/bin/python benchmarks/accelerate.py --model dlrm      # Keras 3 (run as its own process)

Results are printed and, unless --no-record, recorded at the top of benchmarks/results/accelerate.md
with the command, CPU flags, disk and load average.
"""
import argparse
import collections
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

KERAS3_MODELS = ("dlrm", "dcn")
FIELDS, DENSE = 26, 13


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", choices=("deepfm", "tfrs", "dlrm", "dcn"), default="deepfm",
                        help="which model (default deepfm); dlrm and dcn run on Keras 3")
    parser.add_argument("--vocab", type=int, default=0, help="deepfm: ids per field (default 100000); tfrs: users "
                        "and movies each (default MovieLens 1M's 6,000 and 4,000)")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="examples per step (default: deepfm 1024, tfrs 8192 as its tutorial, dlrm/dcn 1024)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per block (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per path, interleaved (default 5)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per path first (default 3)")
    parser.add_argument("--eval-rows", type=int, default=50_000, help="held-out rows for quality (default 50000)")
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow's intra- and inter-op threads (default 0: TensorFlow's choice, one per "
                             "core); 1 makes the CPU time per step the step's work alone, without thread hand-offs "
                             "or spinning: the measure a shared machine disturbs least")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after timing, trace STEPS more steps of each path (interleaved, tf.profiler) and "
                             "give each path's op time per step by op type (default 0: no trace)")
    parser.add_argument("--no-record", action="store_true", help="do not append to benchmarks/results/accelerate.md")
    args = parser.parse_args(argv)
    if (args.vocab == 1 or args.vocab < 0 or args.batch_size < 0 or args.steps < 1 or args.repeats < 1
            or args.warmup < 0 or args.profile < 0 or args.threads < 0):
        parser.error("--vocab 0 (the model's default) or >= 2, --batch-size >= 0, --steps and --repeats >= 1, --warmup, --profile and "
                     "--threads >= 0 are required")
    args.batch_size = args.batch_size or (8192 if args.model == "tfrs" else 1024)
    args.vocab = args.vocab or (100_000 if args.model == "deepfm" else 0)
    return args


ARGS = parse_args(sys.argv[1:] if __name__ == "__main__" else [])
if ARGS.model in KERAS3_MODELS:
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
else:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import ttf  # noqa: E402  (before deepctr / tfrs: tf.keras must resolve to the Keras chosen above)
import tensorflow as tf  # noqa: E402

if ARGS.threads:
    tf.config.threading.set_intra_op_parallelism_threads(ARGS.threads)
    tf.config.threading.set_inter_op_parallelism_threads(ARGS.threads)


# ---------------------------------------------------------------- the models

def deepfm(args):
    from deepctr.feature_column import DenseFeat, SparseFeat
    from deepctr.models import DeepFM

    def rows(n, seed):
        sample = ttf.data.SyntheticCriteo(vocab_per_field=args.vocab).generate(n, seed=seed)
        values = np.minimum(sample["ids"] & ((1 << 56) - 1), args.vocab - 1).astype(np.int32)  # missing -> last id
        x = {f"C{i}": values[:, i:i + 1] for i in range(FIELDS)}
        x.update({f"I{i}": sample["dense"][:, i:i + 1] for i in range(DENSE)})
        return x, sample["label"]

    feats = ([SparseFeat(f"C{i}", args.vocab, embedding_dim=8) for i in range(FIELDS)]
             + [DenseFeat(f"I{i}", 1) for i in range(DENSE)])
    # DeepCTR's default l2_reg_embedding/linear (1e-5) set to 0 in both: ttf tables add no
    # regularization loss (accelerate warns), so with it the models would differ.
    model = DeepFM(feats, feats, task="binary", l2_reg_embedding=0.0, l2_reg_linear=0.0, seed=1)
    model.compile(tf.keras.optimizers.Adam(1e-3), "binary_crossentropy")
    return model, rows, "binary", None


USERS, MOVIES = 6_000, 4_000  # MovieLens 1M's sizes


def ratings_rows(n, seed, features):
    """A planted rating from per-id offsets of every feature, Zipf-popular ids."""
    rng = np.random.default_rng(seed)
    planted = np.random.default_rng(0)
    x, score = {}, np.zeros(n)
    for name, size in features.items():
        ids = np.minimum(rng.zipf(1.2, n) - 1, size - 1)
        x[name] = ids
        score += planted.normal(scale=0.5, size=size)[ids]
    return x, (3.5 + score + rng.normal(scale=0.3, size=n)).astype(np.float32)


def tfrs(args):
    import tensorflow_recommenders as tfrs_lib

    n_users, n_movies = (args.vocab, args.vocab) if args.vocab else (USERS, MOVIES)
    users = np.array([f"u{i}" for i in range(n_users)])
    movies = np.array([f"m{i}" for i in range(n_movies)])

    class RankingModel(tf.keras.Model):
        def __init__(self):
            super().__init__()
            embedding_dimension = 32
            self.user_embeddings = tf.keras.Sequential([
                tf.keras.layers.StringLookup(vocabulary=users, mask_token=None),
                tf.keras.layers.Embedding(len(users) + 1, embedding_dimension)])
            self.movie_embeddings = tf.keras.Sequential([
                tf.keras.layers.StringLookup(vocabulary=movies, mask_token=None),
                tf.keras.layers.Embedding(len(movies) + 1, embedding_dimension)])
            self.ratings = tf.keras.Sequential([tf.keras.layers.Dense(256, activation="relu"),
                                                tf.keras.layers.Dense(64, activation="relu"),
                                                tf.keras.layers.Dense(1)])

        def call(self, inputs):
            user_id, movie_title = inputs
            return self.ratings(tf.concat([self.user_embeddings(user_id), self.movie_embeddings(movie_title)], axis=1))

    class MovielensModel(tfrs_lib.models.Model):
        def __init__(self):
            super().__init__()
            self.ranking_model = RankingModel()
            self.task = tfrs_lib.tasks.Ranking(loss=tf.keras.losses.MeanSquaredError(),
                                               metrics=[tf.keras.metrics.RootMeanSquaredError()])

        def call(self, features):
            return self.ranking_model((features["user_id"], features["movie_title"]))

        def compute_loss(self, features, training=False):
            labels = features.pop("user_rating")
            return self.task(labels=labels, predictions=self(features))

    def rows(n, seed):
        x, y = ratings_rows(n, seed, {"user_id": n_users, "movie_title": n_movies})
        return {"user_id": users[x["user_id"]], "movie_title": movies[x["movie_title"]], "user_rating": y}, y

    model = MovielensModel()
    model.compile(optimizer=tf.keras.optimizers.Adagrad(learning_rate=0.1))
    sample = {k: v[:16] for k, v in rows(16, 99)[0].items() if k != "user_rating"}
    model(sample)
    return model, rows, "rating", sample


DLRM_SPARSE = {"movie_id": 3_900, "user_id": 6_040, "user_zip_code": 140_000, "user_occupation": 21,
               "bucketized_user_age": 7, "user_gender": 2}  # about 150k ids, dim 8
DLRM_DENSE = ["raw_user_age", "hour_of_day_sin", "hour_of_day_cos", "hour_of_week_sin", "hour_of_week_cos"]


def dlrm(args):
    import keras
    import keras_rs

    class DLRM(keras.Model):
        def __init__(self, dense_num_units_lst, mlp_num_units_lst, embedding_dim=8, **kwargs):
            super().__init__(**kwargs)
            self.embedding_layers = {}
            for feature_name, vocabulary_size in DLRM_SPARSE.items():
                self.embedding_layers[feature_name] = keras.layers.Embedding(
                    input_dim=vocabulary_size + 1, output_dim=embedding_dim)
            self.bottom_mlp = keras.Sequential([keras.layers.Dense(u, activation="relu") for u in dense_num_units_lst])
            self.dot_layer = keras_rs.layers.DotInteraction()
            self.top_mlp = keras.Sequential([keras.layers.Dense(u, activation="relu") for u in mlp_num_units_lst])
            self.output_layer = keras.layers.Dense(1)

        def call(self, inputs):
            dense_output = self.bottom_mlp(keras.ops.stack([inputs[f] for f in DLRM_DENSE], axis=-1))
            sparse_embeddings = [self.embedding_layers[f](inputs[f]) for f in DLRM_SPARSE]
            x = self.dot_layer([dense_output] + sparse_embeddings)
            return self.output_layer(self.top_mlp(keras.ops.concatenate([x, dense_output], axis=-1)))

    def rows(n, seed):
        x, y = ratings_rows(n, seed, DLRM_SPARSE)
        rng = np.random.default_rng(seed + 1)
        x.update({name: rng.normal(size=n).astype(np.float32) for name in DLRM_DENSE})
        return x, y

    model = DLRM(dense_num_units_lst=[192, 192, 8], mlp_num_units_lst=[192, 192, 192])
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=0.01), loss=keras.losses.MeanSquaredError())
    sample = rows(16, 99)[0]
    model(sample)
    return model, rows, "rating", sample


def dcn(args):
    import keras
    import keras_rs

    features = {name: size for name, size in DLRM_SPARSE.items()}
    inputs = {name: keras.Input(shape=(), dtype="int64", name=name) for name in features}
    x0 = keras.layers.Concatenate()([keras.layers.Embedding(size + 1, 8, name=f"{name}_embedding")(inputs[name])
                                     for name, size in features.items()])
    x = keras_rs.layers.FeatureCross()(x0, x0)
    x = keras_rs.layers.FeatureCross()(x0, x)
    x = keras.layers.Dense(192, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(192, activation="relu")(x)))
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01), loss=keras.losses.MeanSquaredError())

    def rows(n, seed):
        return ratings_rows(n, seed, features)

    return model, rows, "rating", None


BUILDERS = {"deepfm": deepfm, "tfrs": tfrs, "dlrm": dlrm, "dcn": dcn}


# ---------------------------------------------------------------- measuring

def predictions(model, x, kind):
    if kind == "rating" and "user_rating" in x:  # the TFRS model's call takes the features only
        x = {k: v for k, v in x.items() if k != "user_rating"}
    return np.asarray(model.predict(x, batch_size=8192, verbose=0)).reshape(-1)


def quality(model, x, y, kind):
    score = predictions(model, x, kind)
    label = y > 0.5 if kind == "binary" else y > np.median(y)
    ranks = np.argsort(np.argsort(score, kind="stable"), kind="stable") + 1.0  # exact AUC of any score scale
    positives, negatives = label.sum(), (~label).sum()
    result = {"auc": float((ranks[label].sum() - positives * (positives + 1) / 2) / (positives * negatives))}
    if kind == "rating":
        result["rmse"] = float(np.sqrt(np.mean((score - y) ** 2)))
    return result


def args_model_is_keras3_subclassed(model):
    return ARGS.model in KERAS3_MODELS and not getattr(model, "_is_graph_network", False) and not hasattr(
        model, "_functional") and type(model).__name__ != "Functional"


def served_difference(fast, x, kind):
    """Largest |served - model| of the export_for_serving SavedModel, loaded back with stock TF."""
    probe = {k: v[:256] for k, v in x.items() if k != "user_rating"}
    signature = None
    if args_model_is_keras3_subclassed(fast):  # Keras 3 keeps no input spec of a subclassed model
        signature = {k: tf.TensorSpec([None, *np.shape(v)[1:]], tf.as_dtype(np.asarray(v).dtype))
                     for k, v in probe.items()}
    with tempfile.TemporaryDirectory() as tmp:
        version = ttf.export_for_serving(fast, os.path.join(tmp, "m"), input_signature=signature)
        serve = tf.saved_model.load(version).signatures["serving_default"]
        inputs = {name: tf.constant(probe[name]) for name in serve.structured_input_signature[1]}
        served = list(serve(**inputs).values())[0].numpy().reshape(-1)
    return float(np.abs(served - predictions(fast, probe, kind)).max())


def bench(args):
    print(f"[accelerate] {args.model}: building the model and its ttf twin", flush=True)
    native, rows, kind, sample = BUILDERS[args.model](args)
    total = args.warmup + args.repeats * args.steps + args.profile
    x, y = rows(total * args.batch_size, 1)
    x_eval, y_eval = rows(args.eval_rows, 2)
    before = predictions(native, x_eval, kind)
    t0 = time.perf_counter()
    fast = ttf.accelerate(native, sample=sample)
    convert_s = time.perf_counter() - t0
    before_diff = float(np.abs(predictions(fast, x_eval, kind) - before).max())
    data = x if kind == "rating" and "user_rating" in x else (x, y)
    batches = tf.data.Dataset.from_tensor_slices(data).batch(args.batch_size).cache()
    for _ in batches:  # fill the cache: timed steps read batches from memory, not the slicing of
        pass  # rows into batches (TFRS strings: ~20 ms CPU a batch, competing with the step for 2 cores)
    paths = {"native": native, "accelerated": fast}
    iterators = {name: iter(batches) for name in paths}
    for model in paths.values():
        model.make_train_function()  # tf_keras returns it, Keras 3 only sets it
    train = {name: model.train_function for name, model in paths.items()}
    rates = {name: [] for name in paths}
    cpu_ms = {name: [] for name in paths}  # CPU time of the whole process (all threads) per step
    for name in paths:
        for _ in range(args.warmup):
            train[name](iterators[name])
    for rep in range(args.repeats):
        for name in list(paths)[::1 if rep % 2 == 0 else -1]:  # ABBA: neither path always runs first
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                logs = train[name](iterators[name])
            float(np.asarray(list(logs.values())[0]))  # wait for the last step
            rates[name].append(args.steps / (time.perf_counter() - t0))
            cpu_ms[name].append((time.process_time() - c0) / args.steps * 1e3)
            print(f"[accelerate] {args.model} block {rep + 1}/{args.repeats} {name}: {rates[name][-1]:.2f} steps/s, "
                  f"{cpu_ms[name][-1]:.1f} CPU ms/step", flush=True)
    op_ms = profile_ops(train, iterators, args.profile) if args.profile else None
    result = {name: dict(steps_per_s=statistics.median(rates[name]), cpu_ms=statistics.median(cpu_ms[name]),
                         **quality(paths[name], x_eval, y_eval, kind)) for name in paths}
    result["op_ms"] = op_ms
    result.update(ratio=result["accelerated"]["steps_per_s"] / result["native"]["steps_per_s"],
                  cpu_ratio=result["native"]["cpu_ms"] / result["accelerated"]["cpu_ms"], convert_s=convert_s,
                  before_diff=before_diff, served_diff=served_difference(fast, x_eval, kind),
                  tables=len(ttf.embedding.tables_in(fast)), kind=kind)
    return result


def profile_ops(train, iterators, steps):
    """Traces `steps` steps of each path (one path, then the other) -> {path: {op type: ms per
    step}}: the time each op type's kernels ran, summed over threads (ops that ran in parallel both
    count). A kernel's time includes any preemption by other processes, so compare op types whose
    kernels are the same in both paths (the dense layers') to see how much of a gap the load made."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=import-outside-toplevel
    op_ms = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in train:
            tf.profiler.experimental.start(os.path.join(tmp, name))
            for _ in range(steps):
                logs = train[name](iterators[name])
            float(np.asarray(list(logs.values())[0]))
            tf.profiler.experimental.stop()
            totals = collections.Counter()
            for folder, _, files in os.walk(os.path.join(tmp, name)):
                for file in (f for f in files if f.endswith(".xplane.pb")):
                    space = xplane_pb2.XSpace.FromString(open(os.path.join(folder, file), "rb").read())
                    for plane in (p for p in space.planes if p.name == "/host:CPU"):
                        names = {key: meta.name for key, meta in plane.event_metadata.items()}
                        for event in (e for line in plane.lines for e in line.events):
                            op = names[event.metadata_id]  # a kernel's event is "node name:op type"
                            if op.count(":") == 1 and " " not in op and not op.startswith("Iterator"):
                                totals[op.rsplit(":", 1)[1]] += event.duration_ps / 1e9 / steps
            op_ms[name] = totals
    return op_ms


def op_table(op_ms, top=14):
    kinds = sorted(set(op_ms["native"]) | set(op_ms["accelerated"]),
                   key=lambda k: -max(op_ms["native"].get(k, 0), op_ms["accelerated"].get(k, 0)))
    lines = ["| op type | native ms/step | accelerated ms/step |", "| --- | --- | --- |"]
    lines += [f"| {k} | {op_ms['native'].get(k, 0):.2f} | {op_ms['accelerated'].get(k, 0):.2f} |" for k in kinds[:top]]
    rest = {n: sum(v for k, v in ms.items() if k in kinds[top:]) for n, ms in op_ms.items()}
    lines.append(f"| the other {len(kinds) - top} op types | {rest['native']:.2f} | {rest['accelerated']:.2f} |")
    ttf_ops = {n: sum(v for k, v in ms.items() if k.startswith("Ttf")) for n, ms in op_ms.items()}
    lines.append(f"| of all, ttf's own ops (Ttf*) | {ttf_ops['native']:.2f} | {ttf_ops['accelerated']:.2f} |")
    lines.append(f"| all ops | {sum(op_ms['native'].values()):.2f} | {sum(op_ms['accelerated'].values()):.2f} |")
    return "\n".join(lines)


def table(args, r):
    rmse = kind_rmse = ""
    if r["kind"] == "rating":
        rmse = " native RMSE | accelerated RMSE |"
        kind_rmse = f" {r['native']['rmse']:.4f} | {r['accelerated']['rmse']:.4f} |"
    return "\n".join([
        f"| model | native steps/s | accelerated steps/s | speed-up | native CPU ms/step | accelerated CPU ms/step | "
        f"CPU speed-up | native AUC | accelerated AUC |{rmse} "
        "max abs pred diff before training | max abs served - model | ttf tables | accelerate() s |",
        "| --- " * (13 + (2 if rmse else 0)) + "|",
        f"| {args.model} | {r['native']['steps_per_s']:.2f} | {r['accelerated']['steps_per_s']:.2f} | "
        f"{r['ratio']:.2f}x | {r['native']['cpu_ms']:.1f} | {r['accelerated']['cpu_ms']:.1f} | {r['cpu_ratio']:.2f}x | "
        f"{r['native']['auc']:.4f} | {r['accelerated']['auc']:.4f} |{kind_rmse} "
        f"{r['before_diff']:.2g} | {r['served_diff']:.2g} | {r['tables']} | {r['convert_s']:.1f} |"])


def main():
    args = ARGS
    result = bench(args)
    text = table(args, result)
    if result["op_ms"]:
        text += (f"\n\nOp time per step by op type (tf.profiler, {args.profile} more steps of each path, "
                 f"kernel time summed over threads):\n\n{op_table(result['op_ms'])}")
    print(text)
    if not args.no_record:
        from _results import machine, record  # pylint: disable=import-outside-toplevel
        keras_name = "Keras 3" if args.model in KERAS3_MODELS else "tf_keras"
        entry = (f"## {args.model} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
                 f"`.venv/bin/python benchmarks/accelerate.py {' '.join(sys.argv[1:])}` on "
                 f"{machine(ROOT)}; TensorFlow {tf.__version__}, {keras_name}; batch "
                 f"{args.batch_size}; medians of {args.repeats} interleaved (ABBA) blocks of {args.steps} steps after "
                 f"{args.warmup} warm-up steps; quality on {args.eval_rows:,} held-out rows after the same "
                 f"{args.warmup + args.repeats * args.steps} steps. Load average at the end "
                 f"(1/5/15 min): {' / '.join(f'{v:.1f}' for v in os.getloadavg())}.\n\n{text}\n")
        print(f"[accelerate] recorded in {record('accelerate', entry)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
