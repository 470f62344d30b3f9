"""Issue 23's quality target: on a drifting stream, online training beats a model trained once
and a model retrained every simulated day, on the AUC of the next hour's rows.

The stream is ttf.data.DriftingSynthetic (planted weights drift, ids turn over), written one
file per simulated hour by the producer (ttf.data.producer.write_part) and read back with
ttf.data.Reader, as a folder stream would be. Three DeepFM models with ttf tables (Adam),
each evaluated on hour h before anything has trained on it, for every h >= --warmup-hours:

  static  trained once, on hours [0, warmup)
  daily   the same until the first day boundary; at each boundary d * day (d >= 1) trained
          anew from scratch on the day before it, [d * day - day, d * day)
  online  trained on [0, warmup), then on each hour right after it was evaluated

and, for "AUC rises as the publish interval shrinks", the online trainer as a server would
see it when it publishes every k hours (--publish-hours): hour h is predicted by the trainer's
state at the last publish, floor(h / k) * k (evaluated at that moment, so one training run
serves every k; k = 1 is the online column). With --parts-per-hour M > 1 each hour is M files,
and one more column publishes every 60/M minutes: part j of hour h is predicted by the online
trainer's state after parts 0..j-1 (it then trains on part j). It is compared with the state of
the hour's start on the same parts: both as the mean of per-part AUCs (one AUC pooled over the
predictions of several states would mix their calibrations).

Prints per-hour AUCs and, over the evaluated hours from the first day boundary on (where the
daily model differs from the static one) and over all of them, the mean AUC of each model
and online's lead; --record puts the table in benchmarks/results/online_quality.md. The target: online -
static >= 0.003 and online > daily.

    .venv/bin/python benchmarks/online_quality.py                       # 48 h x 50k rows, ~15 min on 2 cores
    .venv/bin/python benchmarks/online_quality.py --hours 24 --rows-per-hour 20000 --hours-per-day 8
    .venv/bin/python benchmarks/online_quality.py --quick               # smoke run (tiny), nothing recorded
    .venv/bin/python benchmarks/online_quality.py --hours 48 --rows-per-hour 25000 --parts-per-hour 4 --record
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # models/ are tf_keras models
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ttf  # noqa: E402
from models import ctr  # noqa: E402
from ttf.data.producer import write_part  # noqa: E402


class Model:
    """A DeepFM with ttf tables, its optimizer and a compiled train step."""

    def __init__(self, args):
        spec = ctr.spec_for("criteo", model="fm", embedding_dim=args.embedding_dim)
        self.model = ctr.build(spec, "ttf", seed=args.seed)
        self.optimizer = ctr.make_optimizer("ttf", "adam", args.lr)
        self.batch_size = args.batch_size

        @tf.function
        def train_step(features, labels):
            with tf.GradientTape() as tape:
                logits = self.model.logits(features, training=True)
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
            variables = self.model.trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        self.train_step = train_step
        self.predict = tf.function(lambda features: tf.sigmoid(self.model.logits(features, training=False)))

    def train(self, paths, seed):
        """One pass over the files, rows shuffled (as a trainer reading them would)."""
        reader = ttf.data.Reader(paths, "criteo")
        for features, labels in reader.dataset(self.batch_size, shuffle=True, seed=seed):
            self.train_step(features, labels)

    def predictions(self, paths):
        """(labels, predicted probabilities) of the files' rows, in order."""
        labels, probs = [], []
        for features, y in ttf.data.Reader(paths, "criteo").dataset(8192, shuffle=False):
            labels.append(y.numpy())
            probs.append(self.predict(features).numpy())
        return np.concatenate(labels), np.concatenate(probs)

    def auc(self, paths):
        return ttf.data.best_auc(*self.predictions(paths))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hours", type=int, default=48, help="simulated hours in the stream (default 48)")
    p.add_argument("--rows-per-hour", type=int, default=50_000, help="(default 50000)")
    p.add_argument("--warmup-hours", type=int, default=4, help="hours every model trains on first (default 4)")
    p.add_argument("--hours-per-day", type=int, default=24, help="the daily model's retraining period (default 24)")
    p.add_argument("--vocab-per-field", type=int, default=20_000, help="popularity ranks per field (default 20000)")
    p.add_argument("--drift-rate", type=float, default=1 / 24, help="planted-weight anchors per hour (default 1/24)")
    p.add_argument("--new-id-rate", type=float, default=0.02, help="ranks handed to new ids per hour (default 0.02)")
    p.add_argument("--batch-size", type=int, default=512, help="(default 512)")
    p.add_argument("--lr", type=float, default=0.001, help="Adam learning rate (default 0.001)")
    p.add_argument("--embedding-dim", type=int, default=16, help="(default 16)")
    p.add_argument("--publish-hours", default="1,4,12",
                   help="publish intervals in simulated hours to compare, comma-separated (default 1,4,12)")
    p.add_argument("--parts-per-hour", type=int, default=1,
                   help="files per simulated hour; M > 1 adds the online trainer published every 60/M minutes "
                        "(default 1)")
    p.add_argument("--seed", type=int, default=0, help="stream and model seed (default 0)")
    p.add_argument("--data-dir", default=None, help="folder for the hour files (default: a temporary one, removed)")
    p.add_argument("--record", action="store_true", help="record the result table in benchmarks/results/online_quality.md")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run); nothing recorded")
    args = p.parse_args(argv)
    if args.quick:
        args.hours, args.rows_per_hour, args.warmup_hours, args.hours_per_day, args.vocab_per_field = 6, 3000, 2, 2, 2000
        args.record = False
    try:
        intervals = sorted({int(k) for k in args.publish_hours.split(",")})
    except ValueError:
        p.error(f"--publish-hours takes comma-separated whole hours, got {args.publish_hours!r}")
    if intervals[0] <= 0:
        p.error("--publish-hours must be > 0")
    parts = args.parts_per_hour
    if parts < 1 or args.rows_per_hour % parts:
        p.error("--parts-per-hour must be >= 1 and divide --rows-per-hour")
    columns = [(f"publish_{k}h", f"{k}h") for k in intervals]
    if parts > 1:  # the mean of per-part AUCs, both
        columns += [("publish_1h_parts", f"1h (AUC per {60 / parts:g} min)"),
                    ("publish_sub", f"{60 / parts:g} min (AUC per {60 / parts:g} min)")]
    if not 0 < args.warmup_hours <= args.hours_per_day < args.hours:
        p.error("need 0 < --warmup-hours <= --hours-per-day < --hours (the daily model must retrain at least once)")
    command = "benchmarks/online_quality.py " + " ".join(argv if argv is not None else sys.argv[1:])
    stream = ttf.data.DriftingSynthetic(vocab_per_field=args.vocab_per_field, drift_rate=args.drift_rate,
                                        new_id_rate=args.new_id_rate)
    directory = args.data_dir or tempfile.mkdtemp(prefix="ttf_online_quality_")
    os.makedirs(directory, exist_ok=True)
    started = time.time()
    try:
        files, best = [], []  # files[hour]: the hour's part files
        for hour in range(args.hours):
            written = [write_part(directory, stream, hour, j, args.rows_per_hour // parts, parts, seed=args.seed)
                       for j in range(parts)]
            files.append([path for path, _, _ in written])
            best.append(ttf.data.best_auc(np.concatenate([w[1] for w in written]),
                                          np.concatenate([w[2] for w in written])))
        print(f"[online_quality] {args.hours} hours x {args.rows_per_hour:,} rows written to {directory} "
              f"({time.time() - started:.0f}s)", flush=True)
        day = args.hours_per_day
        static, online = Model(args), Model(args)
        warmup = [path for hour in files[:args.warmup_hours] for path in hour]
        static.train(warmup, args.seed)
        online.train(warmup, args.seed)
        daily = static  # until the first day boundary the daily model is the static one
        rows, published = [], {}  # published[k, h]: AUC on hour h of the state published every k hours
        for hour in range(args.warmup_hours, args.hours):
            if hour % day == 0:
                daily = Model(args)
                daily.train([path for h in files[hour - day:hour] for path in h], args.seed + hour)
            row = {"hour": hour, "static": static.auc(files[hour]), "daily": daily.auc(files[hour]),
                   "online": online.auc(files[hour]), "best": best[hour]}
            for k in intervals:  # a publish now (or the first hour evaluated): it serves the next k hours
                if k > 1 and (hour % k == 0 or hour == args.warmup_hours):
                    for later in range(hour, min(args.hours, (hour // k + 1) * k)):
                        published[k, later] = row["online"] if later == hour else online.auc(files[later])
            row.update({f"publish_{k}h": row["online"] if k == 1 else published[k, hour] for k in intervals})
            if parts == 1:
                online.train(files[hour], args.seed + hour)
            else:  # per part (an AUC pooled over several states would mix their calibrations): the hour's
                # state (published every 1 h) against the state trained on the parts before it (every 60/M min)
                row["publish_1h_parts"] = float(np.mean([online.auc([part]) for part in files[hour]]))
                per_part = []
                for j, part in enumerate(files[hour]):
                    per_part.append(online.auc([part]))
                    online.train([part], args.seed + hour * parts + j)
                row["publish_sub"] = float(np.mean(per_part))
            rows.append(row)
            print(f"[online_quality] hour {hour}: AUC static {row['static']:.4f}, daily {row['daily']:.4f}, "
                  f"online {row['online']:.4f} (planted {row['best']:.4f}); published every "
                  + ", ".join(f"{label} {row[key]:.4f}" for key, label in columns)
                  + f" [{time.time() - started:.0f}s]", flush=True)
    finally:
        if not args.data_dir:
            shutil.rmtree(directory, ignore_errors=True)
    after_day = [r for r in rows if r["hour"] >= day]
    summary = []
    for name, chosen in ((f"hours {day}..{args.hours - 1} (after the first retrain)", after_day),
                         (f"hours {args.warmup_hours}..{args.hours - 1} (all evaluated)", rows)):
        mean = {k: float(np.mean([r[k] for r in chosen])) for k in chosen[0] if k != "hour"}
        summary.append((name, mean))
        print(f"[online_quality] {name}: mean AUC static {mean['static']:.4f}, daily {mean['daily']:.4f}, "
              f"online {mean['online']:.4f}, planted {mean['best']:.4f}; online - static "
              f"{mean['online'] - mean['static']:+.4f} (target >= +0.003), online - daily "
              f"{mean['online'] - mean['daily']:+.4f} (target > 0); published every "
              + ", ".join(f"{label} {mean[key]:.4f}" for key, label in columns), flush=True)
    if args.record:
        from _results import machine, record
        lines = [f"\n## Online quality on a drifting stream ({time.strftime('%Y-%m-%d', time.gmtime())})\n",
                 f"Command: `.venv/bin/python {command.strip()}` ({time.time() - started:.0f}s). "
                 f"Stream: ttf.data.DriftingSynthetic, {args.rows_per_hour:,} rows/hour, vocab {args.vocab_per_field:,}"
                 f"/field, drift rate {args.drift_rate:.4g}/h, new-id rate {args.new_id_rate}/h; DeepFM (ttf, Adam, "
                 f"lr {args.lr}, batch {args.batch_size}); AUC on each hour before any model trained on it. "
                 f"Machine: {machine(ROOT)}; shared with other jobs (figures indicative).\n",
                 "| hours | static | daily | online | planted (best) | online - static | online - daily | "
                 + " | ".join(f"published every {label}" for _, label in columns) + " |",
                 "| --- " * (7 + len(columns)) + "|"]
        for name, mean in summary:
            lines.append(f"| {name} | {mean['static']:.4f} | {mean['daily']:.4f} | {mean['online']:.4f} | "
                         f"{mean['best']:.4f} | {mean['online'] - mean['static']:+.4f} | "
                         f"{mean['online'] - mean['daily']:+.4f} | "
                         + " | ".join(f"{mean[key]:.4f}" for key, _ in columns) + " |")
        record("online_quality", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
