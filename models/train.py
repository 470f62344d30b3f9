"""Trains DeepFM or Wide&Deep on Criteo-format data: native TensorFlow, TFRA, or ttf (--tiacc).

One process (default), or the chief of a parameter-server job when --ps-hosts,
--worker-hosts and --chief-host are given (ps and worker tasks run
`python -m ttf.launch.server`; start_all.sh starts all of them). Prints progress while
training, then global steps/sec, AUC and logloss on the eval data.

Examples:
  python models/train.py --model fm --tiacc --steps 200
  python models/train.py --model wdl --tfra --data day_0.tsv.gz --eval-data day_1.tsv.gz --batch-size 4096
  python models/train.py --model fm --tiacc --checkpoint-dir /tmp/ckpt --metrics-out metrics.json \\
      --ps-hosts 127.0.0.1:2222 --worker-hosts 127.0.0.1:2223,127.0.0.1:2224 --chief-host 127.0.0.1:2225

Exit codes: 0 done, 1 failure (e.g. a parameter server was lost), 2 bad usage.
"""
import dataclasses
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# TensorFlow logs while it is imported, before argparse runs: --verbose is read here too.
# Without it only this CLI's lines are shown (TensorFlow's C++ log level 3 also hides the
# cuDNN/cuFFT/cuBLAS "E" lines a CPU machine prints at start-up); with it, everything.
VERBOSE = "--verbose" in sys.argv[1:]
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0" if VERBOSE else "3"

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # models/ are tf_keras models (TFRA needs Keras 2)
# TF 2.21's C++ logs INFO lines while it loads (absl, before TF_CPP_MIN_LOG_LEVEL applies):
# without --verbose, the C-level stderr is closed for the import (Python's errors still show).
_stderr = None if VERBOSE else os.dup(2)
if _stderr is not None:
    with open(os.devnull, "w") as _null:
        os.dup2(_null.fileno(), 2)
try:
    import ttf  # noqa: E402  (imports TensorFlow, quietly here)
finally:
    if _stderr is not None:
        os.dup2(_stderr, 2)
        os.close(_stderr)

from models import ctr, train_flags  # noqa: E402


def parse_args(argv):
    return train_flags.parse_args(argv, __doc__)

_LOG_RANK = [0]  # in a Horovod job only rank 0 prints progress and results
# The library's argument names in its lines, as this CLI's flags.
_FLAGS = re.compile(r"\b(auc_window|checkpoint_dir|dram_budget|ttl_seconds|JobConfig\.steps)\b(=?)")


def flags(text):
    """A line of ttf's with its argument names spelled as this CLI's flags."""
    return _FLAGS.sub(lambda m: "--" + m.group(1).replace("JobConfig.", "").replace("_", "-") + (" " if m.group(2) else ""),
                      text)


def log(message):
    if _LOG_RANK[0] == 0:
        print(flags(message), flush=True)


def error(message):
    print(f"[train] error: {flags(message)}", file=sys.stderr, flush=True)


def tier_progress(stats, dram_budget):
    return flags(ttf.distribute.tier_progress(stats, dram_budget))


def prepare_synthetic(args):
    """--data synthetic: points args.data at the cached synthetic file (written on first use);
    returns the best achievable AUC on the rows evaluated (None with --eval-data)."""
    config = ttf.data.Synthetic(schema=args.schema, vocab_per_field=args.synthetic_vocab)
    path, info = ttf.data.cached_synthetic(args.cache_dir, args.synthetic_rows, config)
    shown = os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT + os.sep) else path
    log(f"[train] data: {info['rows']:,} synthetic {config.schema.name} rows of a planted model "
        f"({args.synthetic_vocab:,} values per field), "
        f"{'cached in' if info['cached'] else 'written in ' + format(info['seconds'], '.1f') + 's to'} {shown}")
    args.data = [path]
    return None if args.eval_data else info["best_auc_eval"]


def job_config(args):
    publish = (ttf.distribute.PublishConfig(args.publish_dir, args.publish_every, args.dense_publish_every,
                                            args.rebase_every, args.export_rows) if args.publish_dir else None)
    return ttf.distribute.JobConfig(
        batch_size=args.batch_size, steps=args.steps, epochs=args.epochs, steps_per_call=args.steps_per_call,
        log_every=args.log_every, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        full_every=args.full_every, max_non_finite_steps=args.max_non_finite_steps, precision=args.precision,
        seed=args.seed, logdir=args.logdir, auc_window=args.auc_window, publish=publish, ttl_seconds=args.ttl_seconds,
        journal=args.stream_journal, pipeline=args.pipeline)


def make_topology(args):
    if args.horovod or args.sync:
        try:
            topology = (ttf.distribute.SyncWorkers(ttf.distribute.Cluster(worker_hosts=args.sync_hosts,
                                                                          task_type="worker",
                                                                          task_index=args.sync_index),
                                                   args.hvd_compression) if args.sync
                        else ttf.distribute.HorovodRanks(args.hvd_compression))
        except ImportError as err:
            raise SystemExit(f"[train] error: --horovod needs horovod: {err}".replace("\n", " ")) from err
        _LOG_RANK[0] = topology.rank
        # Every flag must agree (but the task's own): a rank with another batch size or seed would silently train
        # another model.
        try:
            own = ("task_index", "sync_index", "task_role")
            flags = json.loads(json.dumps({k: v for k, v in vars(args).items() if k not in own},
                                          default=lambda v: dataclasses.asdict(v)  # TableConfig
                                          if dataclasses.is_dataclass(v) else repr(v)))
            topology.check_same_config(flags, what="train.py flags")
        except ValueError as err:
            raise SystemExit(f"[train] error (rank {topology.rank}): {err}") from err
        tables = "ttf tables sharded by id" if args.tiacc else "Keras embeddings through horovod's DistributedOptimizer"
        log(f"[train] {topology.runtime} synchronous job: {topology.size} rank(s), {tables}, "
            f"compression {args.hvd_compression}" + (f"; {args.task_role}" if args.sync else ""))
        return topology
    if args.ps_hosts:
        cluster = ttf.distribute.Cluster(args.ps_hosts, args.worker_hosts, args.chief_host, "chief")
        if getattr(args, "task_role", None):  # where TF_CONFIG or the flags put this chief
            log(f"[train] {args.task_role}")
        log(f"[train] connecting to {len(cluster.ps_hosts)} ps and {len(cluster.worker_hosts)} worker task(s)")
        return ttf.distribute.ParameterServers(cluster)
    return ttf.distribute.OneProcess()


def run(args, readers, best_auc=None, topology=None):
    """Builds the model and the job, trains (or follows the stream), evaluates; returns the metrics."""
    topology = topology or make_topology(args)
    path = "ttf" if args.tiacc else "tfra" if args.tfra else "native"
    spec = ctr.spec_for(args.schema, model=args.model, embedding_dim=args.embedding_dim,
                        native_buckets=args.native_buckets)
    with topology.scope():
        model = ctr.build(spec, path, seed=args.seed, shard_devices=topology.shard_devices,
                          table=args.table)
        optimizer = ctr.make_optimizer(path, args.optimizer, args.lr)
        job = ttf.distribute.Job(model, optimizer, forward=ctr.Logits(model), topology=topology,
                                 config=job_config(args), log=lambda message: log("[train] " + message))
    if args.stream:
        result = job.follow(args.stream, schema=args.schema, strict=not args.lenient, poll_seconds=args.stream_poll,
                            kafka_config=args.kafka_settings)
        saved = (f"checkpoint {job.manager.latest} holds the model and the stream position" if job.manager
                 else "no --checkpoint-dir: nothing saved")
        why = f"stopped by {result['stopped_by']}" if result["stopped_by"] else f"reached --steps {args.steps}"
        log(f"[train] {why} after step {job.step()} ({result['examples_trained']} examples trained); {saved}; exiting 0")
        return {"steps": job.step(), "timed_steps": result["timed_steps"], "seconds": result["seconds"],
                "examples_trained": result["examples_trained"], "stream": args.stream,
                "stopped_by": result["stopped_by"], "stream_progress": result["stream_progress"]}
    reader, eval_reader = readers
    result = job.fit(reader, split="all" if args.eval_data else "train")
    scores = job.evaluate(eval_reader or reader, split="all" if eval_reader else "eval")
    job.close()
    if args.export_dir:
        version = job.export_for_serving(args.export_dir, row_dtype=args.export_rows)
        log(f"[train] serving SavedModel (stock TensorFlow ops only) written to {version}")
    if args.lenient:
        for each in (reader, eval_reader):
            if each is not None:
                each.report()
    examples_total, examples_run = job.examples_trained()
    metrics = {
        "model": args.model, "path": path, "optimizer": args.optimizer, "batch_size": args.batch_size,
        "precision": args.precision, "steps": result["steps"], "timed_steps": result["timed_steps"],
        "global_steps_per_sec": result["steps_per_sec"], "bf16_fraction": result["bf16_fraction"],
        "skipped_steps": result["skipped_steps"],
        # One process: CPU seconds (every thread) per timed step, steadier than wall time on a shared machine.
        "cpu_seconds_per_step": result["cpu_seconds_per_step"],
        "examples_per_sec": result["steps_per_sec"] * args.batch_size * topology.size,
        "auc": scores["auc"], "logloss": scores["logloss"], "eval_rows": scores["rows"],
        "examples_trained": examples_total, "examples_trained_this_run": examples_run, "cluster": topology.shape(),
    }
    summary = job.table_summary()
    if summary:
        metrics["table_size"], metrics["table_checksum"], metrics["table_value_sum"] = summary
    if topology.synchronous:
        metrics.update(ranks=topology.size, hvd_compression=args.hvd_compression,
                       wire_bytes_per_step=topology.wire_bytes() / max(result["steps_run"], 1))
    ranks_note = f" ({topology.size} {topology.runtime} ranks)" if topology.synchronous else ""
    log(f"[train] done: {result['steps']} steps, {result['steps_per_sec']:.2f} global steps/sec, "
        f"AUC {scores['auc']:.4f}, logloss {scores['logloss']:.4f} on {scores['rows']} eval rows{ranks_note}"
        + (f" (best achievable AUC {best_auc:.4f}: the planted model's)" if best_auc is not None else ""))
    if best_auc is not None:
        metrics["best_auc"] = best_auc
    return metrics


def main(argv=None):
    args = parse_args(argv)
    if args.horovod:  # before hvd.init: only rank 0 prints (horovodrun and hvdrun set HOROVOD_RANK)
        _LOG_RANK[0] = int(os.environ.get("HOROVOD_RANK", "0"))
    topology = None
    if args.sync:  # TensorFlow enables collectives only before its first op runs
        _LOG_RANK[0] = args.sync_index
        topology = make_topology(args)
    best_auc = prepare_synthetic(args) if args.synthetic else None
    if args.prepare_data:
        return 0
    path = "ttf (--tiacc)" if args.tiacc else "TFRA" if args.tfra else "native TensorFlow"
    args.precision, precision_note = ttf.precision.resolve_precision(args.precision)
    log(f"[train] {('DeepFM' if args.model == 'fm' else 'Wide&Deep')} with {path}, optimizer {args.optimizer}, "
        f"batch {args.batch_size}, precision {args.precision}")
    if precision_note:
        log("[train] " + precision_note.replace("(precision loss or bf16", "(--precision loss or bf16"))
    try:
        strict = not args.lenient
        readers = (None if args.stream else ttf.data.Reader(args.data, args.schema, strict=strict),
                   ttf.data.Reader(args.eval_data, args.schema, strict=strict) if args.eval_data else None)
    except (ValueError, OSError) as err:
        error(str(err))
        return 2
    try:
        metrics = run(args, readers, best_auc, topology)
    except ttf.distribute.BadInputError as err:
        error(f"{err.location} (fix the file or --schema, or pass --lenient to skip and count bad lines)")
        return 2
    except ttf.distribute.LostParameterServerError as err:
        log(f"[train] error: {err}".replace("checkpoint_dir", "--checkpoint-dir"))
        return 1
    except ttf.distribute.LostRankError as err:
        # Every rank prints this: the peers of a lost rank are the ones still able to say so.
        print(f"[train] error {err}".replace("checkpoint_dir", "--checkpoint-dir"), file=sys.stderr, flush=True)
        if args.sync:  # TensorFlow's collective runtime can wait for the lost peer at exit: leave now
            sys.stdout.flush()
            os._exit(1)
        return 1
    except ttf.precision.NonFiniteTrainingError as err:
        log(f"[train] error: {err}")
        return 1
    except ttf.distribute.SaveFailedError as err:
        error(str(err))
        return 1
    except ValueError as err:  # a setting the checkpoint or the stream refuses (e.g. --auc-window)
        error(str(err))
        return 2
    if args.metrics_out and _LOG_RANK[0] == 0:
        with open(args.metrics_out, "w") as f:
            json.dump(metrics, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
