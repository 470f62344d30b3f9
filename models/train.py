"""Trains DeepFM or Wide&Deep on Criteo-format data: native TensorFlow, TFRA, or ttf (--tiacc).

One process (default), or the chief of a parameter-server job when --ps-hosts,
--worker-hosts and --chief-host are given (ps and worker tasks run
`python -m ttf.distribute.server`; start_all.sh starts all of them). Prints progress while
training, then global steps/sec, AUC and logloss on the eval data.

Examples:
  python models/train.py --model fm --tiacc --steps 200
  python models/train.py --model wdl --tfra --data day_0.tsv.gz --eval-data day_1.tsv.gz --batch-size 4096
  python models/train.py --model fm --tiacc --checkpoint-dir /tmp/ckpt --metrics-out metrics.json \\
      --ps-hosts 127.0.0.1:2222 --worker-hosts 127.0.0.1:2223,127.0.0.1:2224 --chief-host 127.0.0.1:2225

Exit codes: 0 done, 1 failure (e.g. a parameter server was lost), 2 bad usage.
"""
import argparse
import contextlib
import json
import math
import os
import tempfile
import re
import sys
import time

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
    import ttf  # noqa: E402
    import numpy as np  # noqa: E402
    import tensorflow as tf  # noqa: E402
finally:
    if _stderr is not None:
        os.dup2(_stderr, 2)
        os.close(_stderr)

from models import ctr  # noqa: E402

SAMPLE_DATA = {"criteo": os.path.join(ROOT, "data", "criteo_sample.txt"),
               "avazu": os.path.join(ROOT, "data", "avazu_sample.txt")}
SYNTHETIC_CACHE = os.path.join(ROOT, "data", "cache")
SYNTHETIC_ROWS, SYNTHETIC_VOCAB = 200_000, 10_000


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["fm", "wdl"], default="wdl", help="fm: DeepFM, wdl: Wide&Deep (default wdl)")
    path = p.add_mutually_exclusive_group()
    path.add_argument("--tiacc", action="store_true", help="ttf: FusedEmbedding + ttf.optimizers")
    path.add_argument("--tfra", action="store_true", help="TFRA dynamic embeddings (neither flag: native TF)")
    p.add_argument("--schema", default="criteo",
                   help="the data's columns: criteo (default: label, 13 dense, 26 categorical; TSV or CSV), avazu "
                        "(CSV with header: 21 categorical + the hour stamp as hour of day and day of week) or a "
                        "JSON schema file (docs/data.md)")
    p.add_argument("--data", nargs="+", default=["synthetic"],
                   help="data files of --schema, plain or .gz; or 'synthetic' (default): rows of a planted model "
                        "(ttf.data.Synthetic) of --schema, written to data/cache on first use (see "
                        "--synthetic-rows), whose best achievable AUC is printed beside the AUC reached; or "
                        "'sample': the bundled real rows (data/criteo_sample.txt, data/avazu_sample.txt)")
    p.add_argument("--eval-data", nargs="+", default=None,
                   help="eval files (default: every 5th line of --data, held out of training)")
    p.add_argument("--batch-size", type=int, default=256, help="examples per step and worker (default 256)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None, help="global steps to train to (default 200)")
    length.add_argument("--epochs", type=int, default=None, help="passes over --data instead of --steps")
    p.add_argument("--optimizer", choices=ctr.OPTIMIZERS, default="adam", help="(default adam)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 0.001)")
    p.add_argument("--precision", choices=["auto", "loss", "fp32", "bf16"], default=None,
                   help="dense-part precision: loss (ttf.precision's loss policy: bf16 while the loss is calm, "
                        "fp32 after spikes), auto (loss on a CPU with native bf16, avx512_bf16 or amx_bf16; fp32 "
                        "elsewhere, where bf16 is emulated and slower), fp32 or bf16 (weights stay fp32 either way); "
                        "default auto with --tiacc, fp32 otherwise")
    p.add_argument("--embedding-dim", type=int, default=16, help="(default 16)")
    p.add_argument("--native-buckets", type=int, default=100_000,
                   help="native path: hash buckets per field (default 100000)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="save here (chief only) and resume from its latest checkpoint when present")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (default 100)")
    p.add_argument("--seed", type=int, default=0, help="model and data-order seed (default 0)")
    p.add_argument("--log-every", type=int, default=50, help="steps between progress lines (default 50)")
    p.add_argument("--metrics-out", default=None, help="write the final metrics as JSON to this file")
    p.add_argument("--lenient", action="store_true", help="skip and count bad input lines instead of failing")
    add_checkpoint_args(p)
    add_summary_args(p)
    add_stream_args(p)
    p.add_argument("--verbose", action="store_true",
                   help="show TensorFlow's own log lines (sets TF_CPP_MIN_LOG_LEVEL=0); without it only this CLI's "
                        "lines are printed (TF_CPP_MIN_LOG_LEVEL=3)")
    synthetic = p.add_argument_group("synthetic data (--data synthetic)")
    synthetic.add_argument("--synthetic-rows", type=int, default=SYNTHETIC_ROWS,
                           help=f"rows of the synthetic file, every 5th held out for eval (default {SYNTHETIC_ROWS:,})")
    synthetic.add_argument("--cache-dir", default=SYNTHETIC_CACHE,
                           help="where synthetic data files are written and found again (default data/cache)")
    synthetic.add_argument("--prepare-data", action="store_true",
                           help="write the synthetic data (when not cached yet) and exit; start_all.sh runs this on "
                                "the worker hosts of a multi-host job, which read the same data/cache path")
    synthetic.add_argument("--synthetic-vocab", type=int, default=SYNTHETIC_VOCAB,
                           help=f"distinct values per field (default {SYNTHETIC_VOCAB:,})")
    tables = p.add_argument_group("bounded ttf tables (--tiacc)")
    tables.add_argument("--table-capacity", default="0",
                        help="rows each process's shard of each ttf table keeps at most after an update, plus "
                             "that update's new ids; rows beyond it are evicted by --evict-policy. A value with a "
                             "unit (K, M, G, T of 1024) is bytes of rows instead (value, optimizer slots, metadata "
                             "and index entry; not with --dram-budget). 0: unbounded (default 0). Examples: "
                             "--table-capacity 1000000 --evict-policy lfu, --table-capacity 512M")
    tables.add_argument("--evict-policy", choices=["lru", "lfu", "ttl"], default="lru",
                        help="lru: least recently updated ids go first; lfu: fewest updates first; ttl: every id "
                             "not updated in --ttl-steps steps (LRU above a --table-capacity); with --dram-budget, also the "
                             "order rows move to disk in (default lru)")
    tables.add_argument("--ttl-steps", type=int, default=0,
                        help="steps without an update after which --evict-policy ttl evicts an id (needs ttl)")
    tables.add_argument("--dram-budget", default="0",
                        help="DRAM + SSD tier: bytes of DRAM rows each process's shard of each ttf table keeps "
                             "(units K, M, G, T of 1024); the rest live under --ssd-dir and come back when "
                             "trained. 0: all in DRAM (default 0). Example: --dram-budget 2G --ssd-dir /mnt/ssd/ttf")
    tables.add_argument("--ssd-dir", default="",
                        help="a writable directory for the disk tier of --dram-budget (its files are unlinked "
                             "caches, not part of a checkpoint)")
    step = p.add_argument_group("training step (ttf.precision.PrecisionTrainStep; a parameter-server job: "
                                "ttf.precision.NonFiniteGuard)")
    step.add_argument("--max-non-finite-steps", type=int, default=20,
                      help="stop with an error (exit 1) after this many steps in a row whose loss or gradient was "
                           "NaN/Inf (each such step is skipped whole and counted); 0 never stops (default 20)")
    step.add_argument("--steps-per-call", type=int, default=1,
                      help="training steps per tf.function call (one Python round trip per K steps; "
                           "progress and checkpoints then fall on multiples of K; a parameter-server job runs K "
                           "steps per scheduled worker call) (default 1)")
    cluster = p.add_argument_group("parameter-server job (this process is the chief)")
    cluster.add_argument("--ps-hosts", default=None, help="comma-separated host:port of the ps tasks")
    cluster.add_argument("--worker-hosts", default=None, help="comma-separated host:port of the worker tasks")
    cluster.add_argument("--chief-host", default=None, help="host:port of this chief")
    hvd = p.add_argument_group("Horovod job (synchronous; run under horovodrun, e.g. by start_all.sh --hvd)")
    hvd.add_argument("--horovod", action="store_true",
                     help="one rank of a Horovod job: each rank trains on its slice of the global batch "
                          "(--batch-size per rank), ttf tables sharded over the ranks, dense gradients allreduced")
    hvd.add_argument("--hvd-compression", choices=["none", "fp16", "bf16"], default="none",
                     help="what crosses the wire between ranks (dense allreduce, embedding rows and their "
                          "gradients) in 16 bits: fp16 or bf16 (default none: float32); the native path takes fp16 only")
    args = p.parse_args(argv)
    if args.horovod and (args.ps_hosts or args.tfra):
        p.error("--horovod runs the native or ttf (--tiacc) path without parameter servers; "
                "drop --ps-hosts/--worker-hosts/--chief-host and --tfra")
    if args.tfra and ctr.tfra_missing():
        p.error(ctr.tfra_missing())
    if args.horovod and args.epochs and args.steps_per_call > 1:
        p.error("--epochs on Horovod needs --steps-per-call 1: the ranks' shares may end a batch apart, and every "
                "rank checks before each step that all ranks still have a batch")
    if args.hvd_compression != "none" and not args.horovod:
        p.error("--hvd-compression needs --horovod")
    if args.horovod and args.hvd_compression == "bf16" and not args.tiacc:
        p.error("--hvd-compression bf16 needs --tiacc (the native path uses horovod's DistributedOptimizer: none or fp16)")
    if args.publish_dir and not args.tiacc:
        p.error("--publish-dir publishes ttf tables: add --tiacc")
    for name in ("publish_every", "dense_publish_every", "rebase_every"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(args, name)}")
    cluster_flags = [args.ps_hosts, args.worker_hosts, args.chief_host]
    if any(cluster_flags) and not all(cluster_flags):
        p.error("a parameter-server job needs all of --ps-hosts, --worker-hosts and --chief-host")
    for name in ("batch_size", "steps", "epochs", "checkpoint_every", "log_every", "steps_per_call", "full_every",
                 "auc_window"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {value}")
    for name in ("synthetic_rows", "synthetic_vocab"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    try:
        schema = ttf.data.load_schema(args.schema)  # args keep the name: plain, JSON-able flags
    except ValueError as err:
        p.error(str(err))
    args.synthetic = args.data == ["synthetic"]
    if args.data == ["sample"]:
        if schema.name not in SAMPLE_DATA:
            p.error(f"no bundled sample for schema {schema.name!r}; give --data FILE")
        args.data = [SAMPLE_DATA[schema.name]]
    for path in ([] if args.synthetic else args.data) + (args.eval_data or []):
        if not os.path.exists(path):
            p.error(f"data file not found: {path}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        p.error(f"--lr must be a finite number > 0, got {args.lr}")
    if args.max_non_finite_steps < 0:
        p.error(f"--max-non-finite-steps must be >= 0, got {args.max_non_finite_steps}")
    check_table_capacity(p, args)
    if (args.evict_policy == "ttl") != (args.ttl_steps > 0):
        p.error("--evict-policy ttl needs --ttl-steps S > 0, and --ttl-steps needs --evict-policy ttl")
    if (args.table_capacity or args.evict_policy == "ttl") and not args.tiacc:
        p.error("--table-capacity and --evict-policy ttl bound ttf tables: add --tiacc")
    check_tier_flags(p, args, schema)
    args.table_options = (dict(capacity=args.table_capacity, evict_policy=args.evict_policy, ttl_steps=args.ttl_steps,
                               dram_budget=args.dram_budget, ssd_dir=args.ssd_dir) if args.tiacc else None)
    check_stream_args(p, args)
    if args.steps is None and args.epochs is None and not args.stream:
        args.steps = 200
    if args.precision is None:
        args.precision = "auto" if args.tiacc else "fp32"
    if args.export_dir and args.tfra:
        p.error("--export-dir writes a SavedModel of stock TensorFlow ops; TFRA's tables need TFRA's ops "
                "(use --tiacc or the native path)")
    return args


def check_table_capacity(p, args):
    """--table-capacity: a bare integer is rows (an int), a value with a unit bytes (kept as the
    size string, which ttf.DynamicEmbedding reads as bytes); one-line errors at start-up."""
    text = args.table_capacity.strip()
    try:
        rows, size = ttf.embedding.parse_capacity(int(text) if text.isdigit() else text)  # digits: rows
    except ValueError:
        p.error(f"--table-capacity must be rows (an integer >= 0, 0: unbounded) or bytes with a unit K, M, G or T "
                f"(e.g. 512M, 2G), got {args.table_capacity!r}")
    args.table_capacity = text if size else rows
    # Each of a table's 16 lock shards (DynamicEmbedding's default) must hold one row with the
    # optimizer's slots, or the first update fails (TtfEmbeddingTable's check).
    slots = {"adam": 2, "ftrl": 2, "adagrad": 1, "sgd": 0}[args.optimizer]
    row_bytes = ttf.embedding.tier_row_bytes(args.embedding_dim + 1, slots)
    if size and size < 16 * row_bytes:
        p.error(f"--table-capacity {text} ({size} bytes) is below one row for each of a table's 16 lock shards "
                f"({row_bytes} bytes a row with {args.optimizer}'s slots): give at least {16 * row_bytes}")


def check_tier_flags(p, args, schema):
    """--dram-budget / --ssd-dir: parsed to bytes and checked at start-up (one-line errors)."""
    try:
        args.dram_budget = ttf.embedding.parse_size(args.dram_budget)
    except ValueError as err:
        p.error(f"--dram-budget: {err}")
    if not args.dram_budget and not args.ssd_dir:
        return
    if not args.tiacc:
        p.error("--dram-budget and --ssd-dir tier ttf tables: add --tiacc")
    if not (args.dram_budget and args.ssd_dir):
        p.error("--dram-budget and --ssd-dir go together: give both for a DRAM + SSD tier, or neither")
    if isinstance(args.table_capacity, str):
        p.error(f"--table-capacity {args.table_capacity} (bytes) with --dram-budget: a tiered table's RAM is already "
                "bounded by --dram-budget; give --table-capacity in rows to bound both tiers")
    try:
        os.makedirs(args.ssd_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=args.ssd_dir).close()
    except OSError as err:
        p.error(f"--ssd-dir {args.ssd_dir} cannot be written ({err.strerror}); give a writable directory")
    # A batch's rows must fit in DRAM: each update's rows are in DRAM while it runs.
    row_bytes = ttf.embedding.tier_row_bytes(args.embedding_dim + 1, 2)
    batch_rows = args.batch_size * max(schema.num_fields, 1)
    if args.dram_budget < batch_rows * row_bytes:
        p.error(f"--dram-budget {args.dram_budget} bytes holds {args.dram_budget // row_bytes} rows, below one "
                f"batch's {batch_rows} ({args.batch_size} x {schema.num_fields} fields, {row_bytes} bytes a row): "
                f"give at least {batch_rows * row_bytes}")


def add_checkpoint_args(p):
    """Flags of delta checkpoints and the serving export."""
    group = p.add_argument_group("delta checkpoints and serving export")
    group.add_argument("--full-every", type=int, default=1,
                       help="every M-th checkpoint is full, the M - 1 between are deltas: only the table rows touched "
                            "since the previous checkpoint, evicted ids as deletions, and the dense state "
                            "(ttf.checkpoint.CheckpointManager; a resume restores the last full one plus its deltas). "
                            "Default 1: every checkpoint is full. Example: --checkpoint-every 100 --full-every 10")
    group.add_argument("--export-dir", default=None,
                       help="after training, write a SavedModel for serving here that needs only stock TensorFlow "
                            "(ttf.export_for_serving: tables frozen into id->row lookups, unseen ids read the default "
                            "row); its serving_default signature takes ids int64 [B, 26] and dense float32 [B, 13] and "
                            "returns probability [B]. D is TF Serving's base path: each export is a new version "
                            "D/<N>/ (N one more than the largest there), written to a temporary folder and renamed "
                            "into place. Example: --export-dir /tmp/ctr_serving")
    group.add_argument("--export-rows", choices=["fp32", "fp16"], default="fp32",
                       help="precision of the embedding rows in the serving export and in published deltas (default "
                            "fp32: predictions equal the trainer's; fp16 halves the rows' bytes)")
    add_publish_args(p)


def add_publish_args(p):
    """Flags of online publishing to serving (ttf.serving.Publisher)."""
    group = p.add_argument_group("publishing to serving while training (ttf.serving.Publisher)")
    group.add_argument("--publish-dir", default=None, metavar="BASE",
                       help="publish the model for serving while it trains: a base version BASE/<N>/ (TF Serving's "
                            "layout, as --export-dir), then every --publish-every seconds a delta BASE/deltas/<N>/<seq>/ "
                            "of the rows touched and the ids deleted, written by each parameter server or Horovod "
                            "rank for its own rows; ttf.serving.DeltaFollower(BASE) serves it (docs/serving.md). "
                            "--tiacc only. Example: --publish-dir /tmp/ctr_online --publish-every 5")
    group.add_argument("--publish-every", type=float, default=10.0,
                       help="seconds between deltas (default 10)")
    group.add_argument("--dense-publish-every", type=float, default=300.0,
                       help="seconds between deltas that also carry the dense weights (default 300)")
    group.add_argument("--rebase-every", type=float, default=3600.0,
                       help="seconds between new base versions, so a follower never replays more than that "
                            "(default 3600)")


def add_summary_args(p):
    """Flags of the TensorBoard scalars (ttf.summary)."""
    group = p.add_argument_group("TensorBoard (ttf.summary)")
    group.add_argument("--logdir", default=None,
                       help="write TensorBoard scalars here at every progress line (--log-every): train/loss, "
                            "train/auc_window, train/examples_per_sec, train/bf16_share, train/skipped_steps and, "
                            "with --tiacc, tables/<table>/rows (and rows_evicted, rows per tier); written by the "
                            "chief of a parameter-server job and rank 0 of a Horovod job. Watch with "
                            "`tensorboard --logdir DIR`. Example: --logdir runs/fm")
    group.add_argument("--auc-window", type=int, default=65_536,
                       help="train/auc_window is the AUC over the last this many training rows, on the predictions "
                            "each step made before its update (default 65536)")


# ---- --stream: online training on a folder or Kafka topic (ttf.data stream sources) ----

def add_stream_args(p):
    """Flags of the run-for-ever trainer (docs/streams.md)."""
    group = p.add_argument_group("online training on a stream (docs/streams.md)")
    group.add_argument("--stream", default=None, metavar="SPEC",
                       help="train on a stream until SIGTERM/SIGINT (then checkpoint, stream position included, and "
                            "exit 0) instead of --data: folder:DIR (files renamed into DIR, read once in name order) "
                            "or kafka:HOST:PORT[,HOST:PORT]/TOPIC (one line of --schema per message). --steps, if "
                            "given, stops it at that step. With --horovod each rank reads its share (Kafka partitions "
                            "p %% ranks == rank, folder files by name) and the ranks step together. "
                            "Example: --stream folder:/data/incoming --checkpoint-dir ck")
    group.add_argument("--stream-poll", type=float, default=1.0,
                       help="seconds between looks at an idle stream, and the longest wait to fill a batch once "
                            "some examples arrived (a batch may then be smaller) (default 1.0)")
    group.add_argument("--ttl-seconds", type=float, default=None, metavar="S",
                       help="event-time TTL (--tiacc): at each progress line, evict the ids not trained on an "
                            "example newer than S seconds before the newest one (the stream's clock: file mtime or "
                            "Kafka timestamp); evictions are published as deletes (ttf.embedding.EventTimeTTL)")
    group.add_argument("--kafka-config", default=None, metavar="FILE",
                       help="Kafka client properties (key=value lines, librdkafka names) for --stream kafka:..., "
                            "e.g. security.protocol=SASL_SSL, ssl.ca.location=..., sasl.mechanisms=PLAIN, "
                            "sasl.username=..., sasl.password=...: passed to the consumer as they are")
    group.add_argument("--stream-journal", default=None, metavar="FILE",
                       help="append one line per step to FILE: the step number, then the stream example ids it "
                            "trained (ttf.data.ID_SHIFT); for exactly-once audits")


def check_stream_args(p, args):
    if not args.stream:
        for name in ("stream_journal", "kafka_config", "ttl_seconds"):
            if getattr(args, name):
                p.error(f"--{name.replace('_', '-')} needs --stream")
        return
    if args.epochs:
        p.error("--stream runs until stopped (or --steps): drop --epochs")
    if args.data != ["synthetic"] or args.prepare_data:
        p.error("--stream replaces --data and --prepare-data: give one of them")
    if args.export_dir or args.eval_data:
        p.error("--export-dir and --eval-data act after training ends; a --stream job does not end that way (it "
                "checkpoints on SIGTERM): drop them, and export or evaluate from its checkpoint")
    if not (math.isfinite(args.stream_poll) and args.stream_poll > 0):
        p.error(f"--stream-poll must be a number > 0, got {args.stream_poll}")
    if args.ttl_seconds is not None and not (args.tiacc and math.isfinite(args.ttl_seconds) and args.ttl_seconds > 0):
        p.error(f"--ttl-seconds needs --tiacc and a number of seconds > 0, got {args.ttl_seconds}")
    try:
        kind, _ = ttf.data.parse_stream_spec(args.stream)
        if args.kafka_config and kind != "kafka":
            raise ValueError("--kafka-config is for --stream kafka:...")
        args.kafka_settings = ttf.data.read_kafka_config(args.kafka_config) if args.kafka_config else None
    except (ValueError, OSError) as err:
        p.error(str(err))
    args.data, args.synthetic = [], False  # nothing to read but the stream


def open_stream(args, horovod=None):
    """The --stream source, this rank's share of it on Horovod (raises ValueError naming a bad
    spec or a missing folder)."""
    opener = horovod.tdh.open_stream if horovod else ttf.data.open_stream
    return opener(args.stream, schema=args.schema, strict=not args.lenient, poll_seconds=args.stream_poll,
                  kafka_config=args.kafka_settings)


def train_stream(trainer):
    """--stream: one step per stream batch until SIGTERM/SIGINT (or --steps); the batch's
    position is committed after its update, so every checkpoint pairs the model with the
    stream position it has seen. Returns (steps run, seconds)."""
    args, stream = trainer.args, trainer.stream
    if trainer.coordinator:
        return train_stream_cluster(trainer)
    horovod = trainer.horovod
    step = start = trainer.step()
    started = last_log = time.perf_counter()
    # Horovod: rank 0 writes every rank's ids of a step (gathered).
    journal = open(args.stream_journal, "a", encoding="utf-8") if args.stream_journal and _LOG_RANK[0] == 0 else None
    left = None if args.steps is None else max(0, args.steps - step)
    stream.update_progress()
    # One trace for every batch size a stream brings (Horovod: ranks on different traces would hang).
    empty = stream.empty_batch()
    trainer.train_step.trace_for_any_batch_size(empty.features, empty.labels)
    with ttf.distribute.StopOnSignal(stream) as stop:
        trainer.stop = stop
        # Horovod: every rank reads its share; the ranks step together (an empty batch where a share had none).
        batches = (horovod.tdh.stream_batches if horovod else ttf.data.stream_batches)(
            stream, args.batch_size, stop, max_steps=left)
        for batch in batches:
            result = trainer.train_step(batch.features, batch.labels)
            stream.commit(batch)
            step += 1
            if args.stream_journal:
                ids = horovod.gather(batch.example_ids, "ttf_journal") if horovod else batch.example_ids
                if journal:
                    journal.write(f"{step} " + " ".join(map(str, ids.tolist())) + "\n")
                    journal.flush()  # in the page cache before any later checkpoint: a kill -9 keeps it
            now = time.perf_counter()
            due = step % args.log_every == 0 or now - last_log > 30
            if due if not horovod else horovod.tdh.agree(due, "progress line"):  # rank 0's clock decides
                log_stream_progress(trainer, step, float(result["loss"]))
                last_log = now
            trainer._maybe_checkpoint(step)  # pylint: disable=protected-access
            trainer.maybe_publish()
    if journal:
        journal.close()
    return step - start, time.perf_counter() - started


def stream_progress(trainer):
    """(the stream's progress dict, the newest event time trained), over every rank's share on
    Horovod (a collective)."""
    if trainer.horovod:
        return trainer.horovod.tdh.stream_progress(trainer.stream)
    return trainer.stream.update_progress(), trainer.stream.last_event_time


def log_stream_progress(trainer, step, loss):
    progress, event_time = stream_progress(trainer)
    evicted = ""
    if trainer.args.ttl_seconds:  # event-time TTL: note the tables' steps at the newest event time, evict
        if event_time is not None:
            trainer.event_ttl.observe(event_time)
        trainer.event_ttl.evict()
        evicted = f", {trainer.event_ttl.evicted} evicted by --ttl-seconds"
    lag = f"lag {progress['lag_seconds']:.1f} s"
    if progress["lag_messages"] >= 0:
        lag += f", {progress['lag_messages']} messages"
    if progress["lag_bytes"] >= 0:
        lag += f", {progress['lag_bytes']} bytes"
    publisher = getattr(trainer, "publisher", None)
    published = f", published base {publisher.version} sequence {publisher.sequence}" if publisher else ""
    log(f"[train] step {step}: loss {loss:.4f}, {progress['examples_per_sec']:.1f} examples/s, {lag}, "
        f"{progress['examples']} examples trained{published}{evicted}" + trainer.table_progress())
    trainer.write_summary(step, loss, extra={ttf.summary.EXAMPLES_PER_SEC: progress["examples_per_sec"],
                                             "stream/lag_seconds": progress["lag_seconds"],
                                             "stream/lag_messages": progress["lag_messages"]})


def train_stream_cluster(trainer):
    """--stream in a parameter-server job: the chief reads the stream and hands each worker one
    batch per round as the arguments of its step (a bounded transfer: one batch); after the
    round's steps are done (coordinator.join) it commits their positions in order, and only
    then may checkpoint. A Python Kafka consumer cannot run inside a worker's graph; the
    folder source reads here too, so both sources have one path."""
    args, stream, strategy, coordinator = trainer.args, trainer.stream, trainer.strategy, trainer.coordinator
    workers = len(trainer.cluster.worker_hosts)
    variables, guard = trainer.model.trainable_variables, trainer.guard
    step_fns = {}
    with strategy.scope():  # on a ps: counts update starts, to see a lost worker's step run again
        attempts = ttf.distribute.StepAttempts()

    def step_fn(dtype):  # one function per precision; batches of any size (reduce_retracing)
        if dtype not in step_fns:
            @tf.function(reduce_retracing=True)
            def worker_step(features, labels):
                loss, grads = strategy.run(trainer.replica_grads, args=(dtype, features, labels))
                loss = attempts.mark(loss)  # the guard's update depends on the loss: counted before it
                skip = guard.apply_gradients(trainer.optimizer, loss, zip(grads, variables), strategy)
                return tf.identity(loss), tf.identity(skip)
            step_fns[dtype] = worker_step
        return step_fns[dtype]

    step = start = trainer.step()
    started = last_log = time.perf_counter()
    journal = open(args.stream_journal, "a", encoding="utf-8") if args.stream_journal else None
    loss, low = float("nan"), trainer.use_bf16(None)
    stream.update_progress()
    started_before = attempts.read()
    with ttf.distribute.StopOnSignal(stream) as stop:
        trainer.stop = stop
        while not stop.requested and (args.steps is None or step < args.steps):
            # One batch per worker; a round never waits for more than the first batch and one poll.
            room = workers if args.steps is None else min(workers, args.steps - step)
            batches = [stream.next_batch(args.batch_size)]
            if batches[0] is None:  # stopped
                break
            while len(batches) < room and not stop.requested:
                more = stream.next_batch(args.batch_size, block=False)
                if more is None:
                    break
                batches.append(more)
            dtype = tf.bfloat16 if low else tf.float32
            results = [coordinator.schedule(step_fn(dtype), args=(b.features, b.labels))
                       for b in batches]
            coordinator.join()
            fetched = [r.fetch() for r in results]
            now_started = attempts.read()
            started, started_before = now_started - started_before, now_started
            if started != len(batches) and roll_back(trainer, started, len(batches)):
                step = trainer.step()  # the round's batches are read again from the restored position
                continue
            guard.observe([skip for _, skip in fetched], step)
            for batch in batches:  # after every step of the round: in stream order
                stream.commit(batch)
                step += 1
                if journal:
                    journal.write(f"{step} " + " ".join(map(str, batch.example_ids.tolist())) + "\n")
                    journal.flush()
            for value, skip in fetched:
                loss = float(value)
                low = trainer.use_bf16(float("nan") if skip else loss)
            trainer.low_steps += len(batches) * int(dtype == tf.bfloat16)
            now = time.perf_counter()
            if step // args.log_every > (step - len(batches)) // args.log_every or now - last_log > 30:
                log_stream_progress(trainer, step, loss)
                last_log = now
            trainer._maybe_checkpoint(step, every_chunk=True)  # pylint: disable=protected-access
            trainer.maybe_publish()
    if journal:
        journal.close()
    return step - start, time.perf_counter() - started


def roll_back(trainer, started, steps):
    """A round whose steps started `started` times for `steps` batches: the coordinator ran a
    lost worker's step again, so a batch may be trained twice. Restores the last checkpoint
    (model, stream position, TTL notes) and rewinds the stream to it; publishing starts a new
    base (the follower must not keep rows of the rolled-back steps). Returns False (and warns)
    when there is no checkpoint to go back to: the round then counts as trained."""
    manager = trainer.manager
    if manager is None or manager.restore_latest() is None:
        log(f"[train] warning: {started} step starts for {steps} steps this round: a worker was lost and its step "
            "run again, so its batch may be trained twice; give --checkpoint-dir for exactly once (the job then "
            "rolls back to its last checkpoint)")
        return False
    trainer.stream.rewind()
    if getattr(trainer, "publisher", None) is not None:
        trainer.publisher.publish_base()
    log(f"[train] a worker was lost: {started} step starts for {steps} steps this round (its step was run again, "
        f"which may train a batch twice); rolled back to {manager.latest} at step {trainer.step()}, reading the "
        f"stream again from {trainer.stream.describe()}")
    return True


def finish_stream(trainer, steps, seconds):
    """--stream after the loop: publish (--publish-dir), checkpoint (stream position included),
    one line, exit code 0."""
    args, stop = trainer.args, trainer.stop
    trainer.maybe_publish(final=True)
    saved = "no --checkpoint-dir: nothing saved"
    if trainer.manager:
        # Not again at a step already saved (on Horovod every rank asks rank 0, in save_checkpoint).
        if trainer.horovod or trainer.manager.last_step != trainer.step():
            trainer.save_checkpoint(trainer.step())
        saved = f"checkpoint {trainer.manager.latest} holds the model and the stream position"
    progress, _ = stream_progress(trainer)
    why = f"stopped by {stop.signal_name}" if stop.requested else f"reached --steps {args.steps}"
    log(f"[train] {why} after step {trainer.step()} ({progress['examples']} examples trained); {saved}; exiting 0")
    if args.metrics_out and _LOG_RANK[0] == 0:
        with open(args.metrics_out, "w") as f:
            json.dump({"steps": trainer.step(), "timed_steps": steps, "seconds": seconds,
                       "examples_trained": progress["examples"], "stream": args.stream,
                       "stopped_by": stop.signal_name, "stream_progress": progress}, f, indent=2)
    return 0

# ---- end of --stream ----


_LOG_RANK = [0]  # in a Horovod job only rank 0 prints progress and results


def log(message):
    if _LOG_RANK[0] == 0:
        print(message, flush=True)


def tier_progress(stats, dram_budget):
    """', rows D DRAM + S disk, DRAM hit rate H% (since start), W% of disk reads from the
    device, B bytes of RAM a key' over the tier stats of some tables (TtfTableTierStats) whose
    budgets add up to dram_budget; and a warning while a lock shard's disk index takes over half
    of its share of the budget (tier_stats' crowded_shards)."""
    total = {name: sum(s[name] for s in stats) for name in stats[0]}
    rows = total["dram_rows"] + total["disk_rows"]
    lookups = total["dram_hits"] + total["disk_hits"]
    hit_rate = 100.0 * total["dram_hits"] / lookups if lookups else 100.0
    waited = 100.0 * total["disk_waits"] / total["disk_hits"] if total["disk_hits"] else 0.0
    ram_per_key = (total["dram_bytes"] + total["disk_index_bytes"]) / max(rows, 1)
    crowded = total["crowded_shards"] > 0
    return (f", rows {total['dram_rows']} DRAM + {total['disk_rows']} disk, DRAM hit rate {hit_rate:.1f}% since start, "
            f"{waited:.0f}% of disk reads from the device (the rest page cache), {ram_per_key:.0f} bytes of RAM a key"
            + (f"; the disk index takes {total['disk_index_bytes']} of the {dram_budget} bytes of --dram-budget, "
               "leaving few rows in DRAM: raise --dram-budget" if crowded else ""))


class HorovodRanks:
    """This process as one rank of a Horovod job (--horovod): ttf tables sharded over the ranks
    (ttf.distribute.horovod), the native path through horovod's own DistributedOptimizer."""

    def __init__(self, args):
        try:
            import ttf.distribute.horovod as tdh  # imports horovod, with a clear error when it is missing
        except ImportError as err:
            raise SystemExit(f"[train] error: --horovod needs horovod: {err}".replace("\n", " ")) from err
        hvd = tdh.hvd
        hvd.init()
        self.hvd, self.tdh = hvd, tdh
        self.rank, self.size = hvd.rank(), hvd.size()
        self.compression = args.hvd_compression
        _LOG_RANK[0] = self.rank
        # Every flag must agree: a rank with another batch size or seed would silently train another model.
        try:
            tdh.check_same_config(vars(args), what="train.py flags")
        except ValueError as err:
            raise SystemExit(f"[train] error (rank {self.rank}): {err}") from err
        self.per_rank_batch = args.batch_size
        tables = "ttf tables sharded by id" if args.tiacc else "Keras embeddings through horovod's DistributedOptimizer"
        log(f"[train] Horovod job: {self.size} rank(s), {tables}, compression {self.compression}")

    def distribute(self, model, optimizer):
        if ttf.embedding.DynamicEmbedding in type(model.sparse).__mro__:
            self.tdh.shard_tables(model, self.compression)
            return self.tdh.DistributedOptimizer(optimizer, self.compression)
        compression = self.hvd.Compression.fp16 if self.compression == "fp16" else self.hvd.Compression.none
        return self.hvd.DistributedOptimizer(optimizer, compression=compression)

    def broadcast(self, model):
        self.tdh.broadcast_variables(model.variables)

    def rank_slice(self, dataset):
        return self.tdh.rank_slice(dataset, self.per_rank_batch)

    def all_have(self, flag):
        """True while every rank still has a batch (--epochs: shares may end a batch apart)."""
        return bool(self.tdh.all_ranks(tf.constant(flag), name="ttf_have_batch").numpy())

    def global_loss(self, losses):
        """The mean of the examples' losses over every rank's batch (a stream's batches differ in size)."""
        return self.tdh.mean_over_examples(losses, name="ttf_loss")

    def gather(self, array, name):
        return self.tdh.gather_rows(array, name)

    def logical_table(self, layer):
        return layer.sharding.gather_export(layer)

    def shape(self):
        return {"horovod_ranks": self.size, "compression": self.compression}

    def save(self, manager, step, position, stream=None):
        # Every rank writes its part of the tables, rank 0 the rest; none when rank 0 has saved
        # this step already (only its manager knows).
        saved = self.hvd.broadcast_object(manager.last_step == step if self.rank == 0 else None,
                                          name="ttf_save_done")
        self.tdh.gather_input_position(position)
        if stream is not None:  # every rank's share of the stream into rank 0's checkpoint
            self.tdh.gather_stream_position(stream)
        if not saved:
            self.tdh.save_checkpoint(manager, step)

    def wire_metrics(self, steps_run):
        """Bytes this rank sent to other ranks per training step (rank 0's count, in its wire precision)."""
        sent = self.tdh.wire_bytes() if self.tdh._wire_bytes else 0  # pylint: disable=protected-access
        return {"hvd_compression": self.compression, "wire_bytes_per_step": sent / max(steps_run, 1)}


def resolve_precision(precision):
    """--precision auto -> loss on a CPU with native bf16, else fp32 (and why)."""
    if precision != "auto":
        return precision, None
    if ttf.precision.cpu_has_native_bf16():
        return "loss", None
    return "fp32", ("[train] precision auto: this CPU has no native bf16 (avx512_bf16 / amx_bf16), where bf16 is "
                    "emulated and slower: training in fp32 (--precision loss or bf16 forces bf16)")


def open_readers(args):
    """(training reader, eval reader or None). Raises ValueError / OSError naming a file that
    cannot be read by --schema (missing, a directory, empty, bad header, broken gzip)."""
    strict = not args.lenient
    return (None if args.stream else ttf.data.Reader(args.data, args.schema, strict=strict),
            ttf.data.Reader(args.eval_data, args.schema, strict=strict) if args.eval_data else None)


_BAD_LINE = re.compile(r"(\S+:\d+: bad \S+ line: .*?)(?: \(read with strict=False|\n|$)")


def bad_line_message(err):
    """The reader's `file:line: reason` inside a TensorFlow error, or None for other errors."""
    found = _BAD_LINE.search(str(err))
    return found.group(1) if found else None


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


def make_precision_policy(precision):
    """--precision (resolved) -> the policy of the training step: None (fp32), always
    bf16, or the loss-driven switch (loss)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return ttf.precision.AdaptivePrecision("time", start_step=0)
    return ttf.precision.AdaptivePrecision("loss", warmup_steps=20, calm_steps=10, hold_steps=50, interval=500,
                                           interval_hold=10)


def make_train_step(model, optimizer, policy, args, global_loss=None, finite_across=None, auc_window=None):
    """The one-process (or one Horovod rank's) training step: sigmoid cross-entropy on the
    model's logits. global_loss (Horovod): the examples' losses -> their mean over every rank's
    batch (tdh.mean_over_examples: batches may differ in size, or be empty, on a stream), so
    every rank takes the same precision decision and the averaged gradients are the global
    batch's.
    finite_across (Horovod): every rank skips a step where any rank's gradient is not finite.
    auc_window (--logdir): a ttf.summary.RollingAUC that records each batch's predictions."""
    def loss_fn(labels, logits):
        losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        loss = tf.reduce_mean(losses) if global_loss is None else global_loss(losses)
        return loss if auc_window is None else with_recorded(auc_window, labels, logits, loss)

    return ttf.precision.make_train_step(ctr.Logits(model), loss_fn, optimizer, policy,
                                         max_non_finite_steps=args.max_non_finite_steps,
                                         finite_across=finite_across)


def with_recorded(auc_window, labels, logits, loss):
    """loss, once auc_window has recorded the batch's (label, prediction) pairs."""
    with tf.control_dependencies([auc_window.record(labels, logits)]):
        return tf.identity(loss)


class Trainer:
    """Builds the model, optimizer and checkpoint for one run; trains and evaluates."""

    def __init__(self, args, readers=None):
        self.args = args
        self.path = "ttf" if args.tiacc else "tfra" if args.tfra else "native"
        self.spec = ctr.spec_for(args.schema, model=args.model, embedding_dim=args.embedding_dim,
                                 native_buckets=args.native_buckets)
        self.cluster = None
        self.strategy = self.coordinator = None
        self.horovod = HorovodRanks(args) if args.horovod else None
        if args.ps_hosts:
            self.cluster = ttf.distribute.ClusterConfig(args.ps_hosts, args.worker_hosts, args.chief_host)
            log(f"[train] connecting to {len(self.cluster.ps_hosts)} ps and {len(self.cluster.worker_hosts)} "
                "worker task(s)")
            self.strategy, self.coordinator = ttf.distribute.make_coordinator(self.cluster)
        self.reader, self.eval_reader = readers or open_readers(args)
        scope = self.strategy.scope() if self.strategy else contextlib.nullcontext()
        with scope:
            # --stream: read by this process (the chief of a PS job); its position variables live
            # where the job's variables do (made after connecting), checkpointed as stream_position.
            self.stream = open_stream(args, self.horovod) if args.stream else None
            if self.stream is not None:  # an idle stream still publishes the rows its last steps trained
                self.stream.on_idle = self.maybe_publish
            shard_devices = self.cluster.ps_devices() if self.cluster else None
            self.model = ctr.build(self.spec, self.path, seed=args.seed, shard_devices=shard_devices,
                                   table_options=getattr(args, "table_options", None))
            self.optimizer = ctr.make_optimizer(self.path, args.optimizer, args.lr)
            if self.horovod:
                self.optimizer = self.horovod.distribute(self.model, self.optimizer)
            features = (ttf.data.zero_features(args.schema) if self.stream
                        else next(iter(self.reader.dataset(2, shuffle=False)))[0])
            self.model(features, training=False)  # creates the variables (on the ps tasks in a cluster)
            parts = {"model": self.model, "optimizer": self.optimizer}
            # Each worker / rank reads its own share of --data; where each share continues is checkpointed.
            self.num_shares = (len(self.cluster.worker_hosts) if self.cluster
                               else self.horovod.size if self.horovod else 1)
            self.position = ttf.data.InputPosition(self.num_shares)
            parts["input_position"] = self.position
            if self.stream:
                parts["stream_position"] = self.stream
            # --ttl-seconds: its notes (table step at event time) are checkpointed with the tables they describe.
            self.event_ttl = (ttf.embedding.EventTimeTTL(ttf.embedding.tables_in(self.model), args.ttl_seconds)
                              if args.ttl_seconds else None)
            if self.event_ttl is not None:
                parts["event_ttl"] = self.event_ttl
            self.precision = make_precision_policy(args.precision)
            # --logdir: the ring of recent (label, prediction) pairs, beside the job's variables (a ps task in a cluster).
            self.auc_window = ttf.summary.RollingAUC(args.auc_window) if args.logdir else None
            if self.auc_window is not None:  # a resumed job continues its window
                parts["auc_window"] = self.auc_window
            if self.precision is not None:
                parts["precision"] = self.precision
            self.train_step = self.guard = None
            if self.strategy:  # a worker's step is written here; the guard gives it the one-process protection
                self.guard = ttf.precision.NonFiniteGuard(args.max_non_finite_steps)
                self.guard.build(self.optimizer, self.model.trainable_variables)
                parts["non_finite_guard"] = self.guard
            else:
                self.train_step = make_train_step(
                    self.model, self.optimizer, self.precision, args,
                    global_loss=self.horovod.global_loss if self.horovod else None,
                    finite_across=self.horovod.tdh.all_ranks if self.horovod else None, auc_window=self.auc_window)
                parts["train_step"] = self.train_step
            self.checkpoint = tf.train.Checkpoint(**parts)
        self.manager = None
        if args.checkpoint_dir:
            self.manager = ttf.checkpoint.CheckpointManager(self.checkpoint, args.checkpoint_dir,
                                                            full_every=args.full_every, max_to_keep=3)
            self._check_auc_window()
            if self.manager.restore_latest() is not None:
                log(f"[train] resumed from {self.manager.latest} at step {self.step()}")
                state = self.position.state.numpy()
                log("[train] input position: " + ", ".join(
                    f"share {i} at epoch {e}, line {line} + {k} batch(es)" if line >= 0 else f"share {i} not started"
                    for i, (e, _, _, line, k) in enumerate(state))
                    + f"; {self.position.examples_trained()} examples trained so far")
                if self.stream:
                    log(f"[train] stream position: {self.stream.describe()}")
            if self.stream:  # Horovod: each rank takes its share of the merged position
                try:
                    self.stream.adopt_share()
                except ValueError as err:
                    print(f"[train] error: {err}", file=sys.stderr, flush=True)
                    raise SystemExit(2) from err
        if self.horovod:
            self.horovod.broadcast(self.model)  # rank 0's dense weights everywhere (same seed: already equal)
        self.low_steps = 0  # parameter-server job: steps run with the dense part in bf16
        self.timed_cpu = None  # one process: CPU seconds of this process over the timed steps
        self.low_steps_before = int(self.train_step.low_precision_steps.numpy()) if self.train_step else 0
        self.examples_before = self.position.examples_trained()
        # Only the chief (one process, a cluster's chief, Horovod rank 0) writes; the others' calls do nothing.
        self.summary = ttf.summary.JobSummary(args.logdir, writer=_LOG_RANK[0] == 0) if args.logdir else None
        self.step_before = self.step()

    def _check_auc_window(self):
        """--auc-window must be the size the checkpoint's window was saved with (one clear line, exit 2)."""
        if self.auc_window is None or self.manager.latest is None:
            return
        shapes = tf.train.load_checkpoint(self.manager.latest).get_variable_to_shape_map()
        saved = shapes.get("auc_window/_probs/.ATTRIBUTES/VARIABLE_VALUE")
        if saved is not None and saved != [self.auc_window.capacity]:
            print(f"[train] error: --auc-window {self.auc_window.capacity} differs from the {saved[0]} rows of the window "
                  f"saved in {self.manager.latest}: give --auc-window {saved[0]} (or a new --checkpoint-dir)",
                  file=sys.stderr, flush=True)
            raise SystemExit(2)

    def step(self):
        """The global step: steps applied, plus steps skipped as non-finite."""
        return int(self.optimizer.iterations.numpy()) + self.skipped_steps()

    def bf16_fraction(self, steps_run):
        if self.train_step:
            low = int(self.train_step.low_precision_steps.numpy()) - self.low_steps_before
        else:
            low = self.low_steps
        return low / max(steps_run, 1)

    def skipped_steps(self):
        """Steps skipped as non-finite (a NaN/Inf loss or gradient)."""
        counter = self.train_step or self.guard
        return int(counter.skipped_steps.numpy()) if counter else 0

    def table_progress(self):
        """', table rows R (E evicted)' for bounded ttf tables, the tiers for tiered ones, else
        '': of every parameter server's shard in a PS job (numbers only travel), of this rank's
        on Horovod (said so: each rank holds its own)."""
        options = getattr(self.args, "table_options", None)
        if not options or not (options["capacity"] or options["evict_policy"] == "ttl" or options["dram_budget"]):
            return ""
        tables = [t for layer in ttf.embedding.tables_in(self.model) for t in layer.tables]
        shard = " (this rank's table shards)" if self.horovod else ""
        if options["dram_budget"]:
            return tier_progress([t.tier_stats() for t in tables], sum(t.dram_budget for t in tables)) + shard
        rows = sum(int(t.size()) for t in tables)
        evicted = sum(int(t.stats().rows_evicted) for t in tables)
        return f", table rows {rows} ({evicted} evicted){shard}"

    def table_summary(self):
        """ttf path: (ids stored, order-independent checksum, float64 sum of every stored value
        and slot) over all shards, to check a restore against its checkpoint; None on other
        paths. Each shard's numbers are computed where it lives; only numbers travel."""
        if self.path != "ttf":
            return None
        summary = ttf.embedding.table_summary(*ttf.embedding.tables_in(self.model))
        if self.horovod:  # every rank holds its own shard: add the ranks' numbers
            summary = ttf.embedding.table_summary(*self.horovod.hvd.allgather_object(summary))
        return summary

    def export_for_serving(self, base):
        """Writes the next serving version, base/<version>/ (TF Serving's layout), and returns
        its folder. In a parameter-server job each table shard is frozen on its own parameter
        server and saved from there (ttf.export_for_serving): the chief never holds the rows."""
        row_dtype = tf.float16 if self.args.export_rows == "fp16" else tf.float32
        if self.horovod:  # every rank gathers each table's rows; rank 0 writes the version once
            return self.horovod.tdh.export_for_serving(self.model, base, row_dtype=row_dtype)
        return ttf.export_for_serving(self.model, base, row_dtype=row_dtype)

    # -- publishing to serving (--publish-dir): the loops call maybe_publish, main a final publish

    def maybe_publish(self, final=False):
        """A base, then a delta every --publish-every seconds (ttf.serving.Publisher: each PS
        writes its own rows); final: publish now. A full disk pauses it with one line, never
        stops training."""
        if not self.args.publish_dir:
            return None
        if getattr(self, "publisher", None) is None:  # Horovod: every rank writes its own part
            publisher = self.horovod.tdh.Publisher if self.horovod else ttf.serving.Publisher
            self.publisher = publisher(
                self.model, self.args.publish_dir, publish_every=self.args.publish_every,
                dense_publish_every=self.args.dense_publish_every, rebase_every=self.args.rebase_every,
                row_dtype=tf.float16 if self.args.export_rows == "fp16" else tf.float32)
        published = self.publisher.publish() if final else self.publisher.maybe_publish()
        if published is not None and final:
            log(f"[train] published to {self.args.publish_dir}: base {published[0]}, sequence {published[1]}")
        return published

    def dataset(self, share):
        """Batches (features, labels, position) of this worker's / rank's share of --data."""
        args = self.args
        return self.reader.share_dataset(args.batch_size, share, self.num_shares, position=self.position,
                                         seed=args.seed, split="all" if args.eval_data else "train",
                                         num_epochs=None if args.steps else args.epochs)

    def examples_trained(self):
        """(rows trained over every run restored into this one, rows trained by this run)."""
        if self.horovod:  # each rank counts its own share (a collective)
            self.horovod.tdh.gather_input_position(self.position)
        total = self.position.examples_trained()
        return total, total - self.examples_before

    def replica_grads(self, compute_dtype, features, labels):
        """A parameter-server worker's forward and backward: (loss, gradients). The
        NonFiniteGuard applies them, or skips the step whole (the one-process job runs
        self.train_step)."""
        with tf.GradientTape() as tape:
            logits = self.model.logits(features, training=True, compute_dtype=compute_dtype)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
            if self.auc_window is not None:
                loss = with_recorded(self.auc_window, labels, logits, loss)
        return loss, tape.gradient(loss, self.model.trainable_variables)

    def use_bf16(self, loss):
        """A parameter-server job's precision for the next chunk: fixed by --precision, or
        the switch's call on the last loss."""
        if self.precision is None:
            return False
        return self.precision.enable_mixed_precision(self.step(), loss=loss)

    def train(self):
        """Trains to --steps (or for --epochs); returns (steps run, seconds of the timed part)."""
        if self.stream:
            return train_stream(self)
        if self.coordinator:
            return self._train_cluster()
        target = self.args.steps
        step = self.step()
        if target is not None and step >= target:
            log(f"[train] already at step {step} >= --steps {target}; nothing to train")
            return 0, 0.0
        per_call = self.args.steps_per_call
        warmup, timed_start, run = max(5, per_call), None, 0
        last_log, last_log_step = time.perf_counter(), step
        iterator = iter(self.dataset(self.horovod.rank if self.horovod else 0))
        record = tf.function(self.position.record)
        while target is None or step < target:
            # No host read per step: the step decides its precision on the device.
            calls = per_call if target is None else min(per_call, target - step)
            if calls == 1:
                batch = next(iterator, None)
                if self.horovod and target is None:  # --epochs: every rank stops when one runs out
                    if not self.horovod.all_have(batch is not None):
                        break
                if batch is None:
                    break
                features, labels, position = batch
                result, ran = self.train_step(features, labels), 1
                record(position, tf.size(labels))
            else:
                result = self.train_step.run(iterator, calls, after_batch=self.position.record)
                ran = int(result["steps"])
                if ran == 0:
                    break
            before, run, step = step, run + ran, step + ran
            if timed_start is None and run >= warmup:
                result["loss"].numpy()
                timed_start, timed_from = time.perf_counter(), run
                self.timed_cpu = -time.process_time()
            if step // self.args.log_every > before // self.args.log_every:
                loss = float(result["loss"])
                now = time.perf_counter()
                skipped = int(self.train_step.skipped_steps.numpy())
                ranks = f" ({self.horovod.size} ranks)" if self.horovod else ""
                log(f"[train] step {step}: loss {loss:.4f}, {(step - last_log_step) / (now - last_log):.1f} steps/s"
                    + (f", {skipped} skipped as non-finite" if skipped else "") + self.table_progress() + ranks)
                self.write_summary(step, loss, (step - last_log_step) / (now - last_log))
                last_log, last_log_step = now, step
            self._maybe_checkpoint(step, every_chunk=per_call > 1)
            self.maybe_publish()
            if ran < calls:  # the data ran out
                break
        if timed_start is None:  # shorter than the warm-up: time everything
            return run, max(time.perf_counter() - last_log, 1e-9)
        self.timed_cpu += time.process_time()
        return run - timed_from, time.perf_counter() - timed_start

    def _train_cluster(self):
        strategy, coordinator = self.strategy, self.coordinator
        workers = len(self.cluster.worker_hosts)

        def dataset_fn(context):
            # Not context.input_pipeline_id: ParameterServerStrategy gives every worker 0 (each
            # worker then read share 0). This function is traced once for every worker: the
            # worker's index is a tensor, known where the dataset is made, and picks its share.
            del context
            worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)
            return tf.data.Dataset.choose_from_datasets([self.dataset(share) for share in range(workers)],
                                                        tf.data.Dataset.from_tensors(worker).repeat(),
                                                        stop_on_empty_dataset=True)

        per_worker = coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(dataset_fn))
        iterator = iter(per_worker)

        variables, guard = self.model.trainable_variables, self.guard

        def worker_steps_for(dtype, steps):
            @tf.function
            def worker_steps(it):  # --steps-per-call steps per closure: one round trip for K steps
                losses, skipped, ran = [], [], []
                for _ in range(steps):
                    # A worker whose share ran out (--epochs) trains nothing: ran is False.
                    batch = it.get_next_as_optional()

                    def train():
                        features, labels, position = batch.get_value()
                        loss, grads = strategy.run(self.replica_grads, args=(dtype, features, labels))
                        # One decision over every gradient before any shard applies (NaN/Inf: skipped whole).
                        skip = guard.apply_gradients(self.optimizer, loss, zip(grads, variables), strategy)
                        with tf.control_dependencies([skip]):  # the batch counts as read once its step ran
                            recorded = self.position.record(position, tf.size(labels))
                        with tf.control_dependencies([recorded]):
                            return tf.identity(loss), tf.identity(skip), tf.constant(True)

                    loss, skip, has = tf.cond(batch.has_value(), train,
                                              lambda: (tf.constant(float("nan")), tf.constant(False), tf.constant(False)))
                    losses.append(loss)
                    skipped.append(skip)
                    ran.append(has)
                worker = tf.distribute.coordinator.experimental_get_current_worker_index()
                return tf.stack(losses), tf.stack(skipped), tf.stack(ran), worker
            return worker_steps

        worker_fns = {}
        # --epochs: workers whose share ran out. The job ends when every worker's has: a chunk
        # whose closures all found no batch may have run on the finished workers only (any free
        # worker takes a closure), while another still has batches.
        finished = set()

        def run(low, steps):
            """Runs `steps` global steps in the precision `low` picks; returns (losses, skipped)
            of the steps that found a batch, in schedule order, after the guard has seen them
            (it raises on a runaway)."""
            first_step, results = self.step(), []
            while steps > 0:
                k = min(self.args.steps_per_call, steps)
                if (low, k) not in worker_fns:
                    worker_fns[low, k] = worker_steps_for(tf.bfloat16 if low else tf.float32, k)
                results.append(coordinator.schedule(worker_fns[low, k], args=(iterator,)))
                steps -= k
            coordinator.join()
            fetched = [result.fetch() for result in results]  # numpy arrays
            finished.update(int(worker) for _, _, has, worker in fetched if not has.all())
            ran = [(float(loss), bool(skip)) for losses, skips, has, _ in fetched
                   for loss, skip, h in zip(losses, skips, has) if h]
            losses, skipped = [loss for loss, _ in ran], [skip for _, skip in ran]
            guard.observe(skipped, first_step)
            return losses, skipped

        target = self.args.steps
        start_step = self.step()
        warmup = min(2 * workers, max(target - start_step, 0)) if target is not None else 2 * workers
        low = self.use_bf16(None)
        if warmup:
            run(low, warmup)
        self.low_steps += warmup * int(low)
        timed_start, timed_from = time.perf_counter(), self.step()
        last_log = time.perf_counter()
        while target is None or self.step() < target:
            chunk = self.args.log_every if target is None else min(self.args.log_every, target - self.step())
            losses, skipped = run(low, chunk)
            if not losses:
                if len(finished) == workers:  # --epochs: every worker's share ran out
                    break
                continue  # this chunk's closures all ran on finished workers
            self.low_steps += len(losses) * int(low)
            for loss, skip in zip(losses, skipped):  # the switch sees every loss; its last call sets the next chunk's
                low = self.use_bf16(float("nan") if skip else loss)  # a skipped step holds float32
            now = time.perf_counter()
            log(f"[train] step {self.step()}: loss {losses[-1]:.4f}, {chunk / (now - last_log):.1f} global steps/s"
                + (f", {sum(skipped)} skipped as non-finite" if any(skipped) else "") + self.table_progress())
            self.write_summary(self.step(), losses[-1], chunk / (now - last_log))
            last_log = now
            self._maybe_checkpoint(self.step(), every_chunk=True)
            self.maybe_publish()
        return self.step() - timed_from, time.perf_counter() - timed_start

    def write_summary(self, step, loss, steps_per_sec=0.0, extra=None):
        """--logdir: the scalars of a progress line (ttf.summary), plus `extra` ({tag: number},
        e.g. a stream's lag). Every Horovod rank calls it (the table counts are a collective);
        only the writer writes."""
        if self.summary is None:
            return
        ranks = self.horovod.size if self.horovod else 1
        values = {ttf.summary.LOSS: loss, ttf.summary.AUC: self.auc_window.auc(),
                  ttf.summary.EXAMPLES_PER_SEC: steps_per_sec * self.args.batch_size * ranks,
                  ttf.summary.BF16_SHARE: self.bf16_fraction(step - self.step_before),
                  ttf.summary.SKIPPED_STEPS: self.skipped_steps()}
        if getattr(self, "publisher", None) is not None and self.publisher.version is not None:
            values["publish/sequence"] = self.publisher.sequence
        values.update(extra or {})
        if self.path == "ttf":
            tables = ttf.summary.table_scalars(ttf.embedding.tables_in(self.model))
            if self.horovod:  # each rank counted its own shards: add them up
                per_rank = self.horovod.hvd.allgather_object(tables)
                tables = {tag: sum(counts[tag] for counts in per_rank) for tag in tables}
            values.update(tables)
        self.summary.scalars(values, step)

    def _maybe_checkpoint(self, step, every_chunk=False):
        if self.manager is None:
            return
        if every_chunk or step % self.args.checkpoint_every == 0:
            if every_chunk and step // self.args.checkpoint_every == getattr(self, "_last_ckpt", -1):
                return
            self._last_ckpt = step // self.args.checkpoint_every
            self.save_checkpoint(step)

    def save_checkpoint(self, step):
        # A line as a save begins and one as it ends: a save's length, and where a fault came.
        saving = self.manager.last_step != step  # (on Horovod, only rank 0's manager knows and prints)
        if saving:
            log(f"[train] checkpoint at step {step}: saving ({'full' if self.manager.delta_plan() is None else 'delta'})")
        started = time.perf_counter()
        if self.horovod:  # every rank writes its part of the tables (a collective); rank 0 the rest
            self.horovod.save(self.manager, step, self.position, self.stream)
        else:
            self.manager.save(step)
        if saving:
            log(f"[train] checkpoint at step {step}: saved in {time.perf_counter() - started:.2f} s")

    def evaluate(self):
        """AUC and logloss of the model on the eval data (run on this process)."""
        args = self.args
        ranks = self.horovod.size if self.horovod else 1
        # Horovod: each rank's slice of a global batch. Otherwise few large calls: in a cluster
        # each one is a round of RPCs.
        batch = args.batch_size * ranks if self.horovod else max(args.batch_size, 4096)
        if args.eval_data:
            data = self.eval_reader.dataset(batch, shuffle=False)
        else:
            data = self.reader.dataset(batch, shuffle=False, split="eval")
        if self.horovod:  # each rank predicts its slice of every batch; the table lookups are collective
            data = self.horovod.rank_slice(data)
        predict = tf.function(lambda features: tf.sigmoid(self.model.logits(features, training=False)))
        labels, probs = [], []
        for features, y in data:
            labels.append(y.numpy())
            probs.append(predict(features).numpy())
        labels, probs = np.concatenate(labels), np.concatenate(probs)
        if self.horovod:  # the whole eval set, once
            labels, probs = self.horovod.gather(labels, "eval_labels"), self.horovod.gather(probs, "eval_probs")
        probs = np.clip(probs, 1e-7, 1 - 1e-7)
        logloss = float(-np.mean(labels * np.log(probs) + (1 - labels) * np.log(1 - probs)))
        auc = ttf.data.best_auc(labels, probs) if 0 < labels.sum() < len(labels) else float("nan")
        return auc, logloss, len(labels)


def main(argv=None):
    args = parse_args(argv)
    if args.horovod:  # before hvd.init: only rank 0 prints (horovodrun and hvdrun set HOROVOD_RANK)
        _LOG_RANK[0] = int(os.environ.get("HOROVOD_RANK", "0"))
    best_auc = prepare_synthetic(args) if args.synthetic else None
    if args.prepare_data:
        return 0
    path = "ttf (--tiacc)" if args.tiacc else "TFRA" if args.tfra else "native TensorFlow"
    args.precision, precision_note = resolve_precision(args.precision)
    log(f"[train] {('DeepFM' if args.model == 'fm' else 'Wide&Deep')} with {path}, optimizer {args.optimizer}, "
        f"batch {args.batch_size}, precision {args.precision}")
    if precision_note:
        log(precision_note)
    try:
        readers = open_readers(args)
    except (ValueError, OSError) as err:
        print(f"[train] error: {err}", file=sys.stderr, flush=True)
        return 2
    try:
        trainer = Trainer(args, readers)
        start_step = trainer.step()
        steps, seconds = trainer.train()
        if args.stream:
            return finish_stream(trainer, steps, seconds)
        steps_run = trainer.step() - start_step
        if trainer.manager:
            # Not again at a step already saved (on Horovod every rank asks rank 0, in save_checkpoint).
            if trainer.horovod or trainer.manager.last_step != trainer.step():
                trainer.save_checkpoint(trainer.step())
            log(f"[train] checkpoint {trainer.manager.latest}")
        trainer.maybe_publish(final=True)
        auc, logloss, eval_rows = trainer.evaluate()
        if trainer.summary:  # --logdir: the eval numbers beside the training curves
            trainer.summary.scalars({"eval/auc": auc, "eval/logloss": logloss}, trainer.step())
            trainer.summary.close()
        if args.export_dir:
            version = trainer.export_for_serving(args.export_dir)
            log(f"[train] serving SavedModel (stock TensorFlow ops only) written to {version}")
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as err:
        lost = trainer.cluster.ps_hosts if getattr(locals().get("trainer"), "cluster", None) else ()
        log(f"[train] error: lost contact with the cluster ({ttf.distribute.error_summary(err)}). "
            f"A parameter server ({', '.join(lost) or 'see above'}) or the network failed; restart the job with the "
            "same --checkpoint-dir to resume from the last checkpoint.")
        return 1
    except tf.errors.InvalidArgumentError as err:
        bad_line = bad_line_message(err)
        if bad_line is None:
            raise
        print(f"[train] error: {bad_line} (fix the file or --schema, or pass --lenient to skip and count bad lines)",
              file=sys.stderr, flush=True)
        return 2
    except ttf.precision.NonFiniteTrainingError as err:
        log(f"[train] error: {err}")
        return 1
    except tf.errors.OpError as err:
        if not args.horovod:
            raise
        # Every rank prints this: the peers of a lost rank are the ones still able to say so.
        print(f"[train] error (rank {_LOG_RANK[0]}): a Horovod collective failed "
              f"({ttf.distribute.error_summary(err)}). Another rank stopped or the network failed; restart every rank "
              "with the same --checkpoint-dir to resume from the last checkpoint.", file=sys.stderr, flush=True)
        return 1
    if args.lenient:
        trainer.reader.report()
        if trainer.eval_reader is not None:
            trainer.eval_reader.report()
    steps_per_sec = steps / seconds if seconds > 0 else float("nan")
    examples_total, examples_run = trainer.examples_trained()
    ranks = trainer.horovod.size if trainer.horovod else 1
    metrics = {
        "model": args.model, "path": trainer.path, "optimizer": args.optimizer, "batch_size": args.batch_size,
        "precision": args.precision, "steps": trainer.step(), "timed_steps": steps,
        "global_steps_per_sec": steps_per_sec, "bf16_fraction": trainer.bf16_fraction(steps_run),
        "skipped_steps": trainer.skipped_steps(),
        # One process: CPU seconds (every thread) per timed step, steadier than wall time on a shared machine.
        "cpu_seconds_per_step": trainer.timed_cpu / steps if trainer.timed_cpu is not None and steps else None,
        "examples_per_sec": steps_per_sec * args.batch_size * ranks,
        "auc": auc, "logloss": logloss, "eval_rows": eval_rows,
        "examples_trained": examples_total, "examples_trained_this_run": examples_run,
        "cluster": trainer.cluster.shape() if trainer.cluster else trainer.horovod.shape() if trainer.horovod else "single",
    }
    summary = trainer.table_summary()
    if summary:
        metrics["table_size"], metrics["table_checksum"], metrics["table_value_sum"] = summary
    if best_auc is not None:
        metrics["best_auc"] = best_auc
    if trainer.horovod:
        metrics["ranks"] = ranks
        metrics.update(trainer.horovod.wire_metrics(steps_run))
    ranks_note = f" ({ranks} Horovod ranks)" if trainer.horovod else ""
    log(f"[train] done: {trainer.step()} steps, {steps_per_sec:.2f} global steps/sec, "
        f"AUC {auc:.4f}, logloss {logloss:.4f} on {eval_rows} eval rows{ranks_note}"
        + (f" (best achievable AUC {best_auc:.4f}: the planted model's)" if best_auc is not None else ""))
    if args.metrics_out and _LOG_RANK[0] == 0:
        with open(args.metrics_out, "w") as f:
            json.dump(metrics, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
