"""models/train.py's flags: their definitions, their checks (one usage line, exit 2), and
what they turn into (TableConfig; the workers of a synchronous job). docs/cli.md is generated
from them (scripts/cli_doc.py)."""
import argparse
import dataclasses
import math
import os
import re

import ttf
from models import ctr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_DATA = {"criteo": os.path.join(ROOT, "data", "criteo_sample.txt"),
               "avazu": os.path.join(ROOT, "data", "avazu_sample.txt")}
SYNTHETIC_CACHE = os.path.join(ROOT, "data", "cache")
SYNTHETIC_ROWS, SYNTHETIC_VOCAB = 200_000, 10_000


def parse_args(argv, description=None):
    """models/train.py's flags, checked: one usage line and exit 2 for a bad one."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["fm", "wdl"], default="wdl", help="fm: DeepFM, wdl: Wide&Deep (default wdl)")
    path = p.add_mutually_exclusive_group()
    path.add_argument("--tiacc", action="store_true", help="ttf: FusedEmbedding + ttf.optimizers")
    path.add_argument("--tfra", action="store_true", help="TFRA dynamic embeddings (neither flag: native TF)")
    p.add_argument("--schema", default="criteo",
                   help="the data's columns: criteo (default: label, 13 dense, 26 categorical; TSV or CSV), avazu "
                        "(CSV with header: 21 categorical + the hour stamp as hour of day and day of week) or a "
                        "JSON schema file (docs/data.md)")
    p.add_argument("--data", nargs="+", default=["synthetic"],
                   help="data of --schema: files (delimited text plain or .gz, Parquet, TFRecord of tf.train.Example "
                        "plain or .gz), globs, or folders of part files (hidden, '_*' and '*.crc' files skipped; "
                        "one format per job); or 'synthetic' (default): rows of a planted model "
                        "(ttf.data.Synthetic) of --schema, written to data/cache on first use (see "
                        "--synthetic-rows), whose best achievable AUC is printed beside the AUC reached; or "
                        "'sample': the bundled real rows (data/criteo_sample.txt, data/avazu_sample.txt)")
    p.add_argument("--eval-data", nargs="+", default=None,
                   help="eval data, as --data (default: every 5th row of --data, held out of training)")
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
    tables.add_argument("--table-rows", choices=["fp32", "bf16", "int8"], default="fp32",
                        help="how ttf tables store rows: fp32, bf16, or int8 (a scale and an offset a row), with "
                             "the optimizer's slots to match (int8: Adagrad's accumulator and Adam's second "
                             "moment one a row plus one for the row's last element, docs/table_rows.md); updates "
                             "round stochastically, seeded; with --dram-budget, the disk tier holds the rows as stored "
                             "(default fp32)")
    step = p.add_argument_group("training step (ttf.precision.PrecisionTrainStep, on every topology)")
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
    sync = p.add_argument_group("synchronous job: each rank trains on its slice of the global batch (--batch-size "
                                "per rank), ttf tables sharded over the ranks, dense gradients allreduced")
    sync.add_argument("--sync", action="store_true",
                      help="one worker of a synchronous job on TensorFlow's own collectives (any TensorFlow, Keras 2 "
                           "or 3; start_all.sh --sync): the workers from --worker-hosts and --task-index, or TF_CONFIG")
    sync.add_argument("--task-index", type=int, default=None,
                      help="with --sync: this worker's position in --worker-hosts (its rank)")
    sync.add_argument("--horovod", action="store_true",
                      help="one rank of a Horovod job (TensorFlow 2.16, Keras 2; run under horovodrun, e.g. by "
                           "start_all.sh --hvd)")
    sync.add_argument("--hvd-compression", "--wire-compression", choices=["none", "fp16", "bf16"], default="none",
                      help="what crosses the wire between ranks (dense allreduce, embedding rows and their "
                           "gradients) in 16 bits: fp16 or bf16 (default none: float32); the native path takes fp16 only")
    sync.add_argument("--pipeline", action="store_true",
                      help="with --sync or --horovod (and --tiacc): route the next batch's ids to their owners while "
                           "this batch trains (the same updates in the same order; docs/sync.md; your own script: "
                           "JobConfig(pipeline=True))")
    args = p.parse_args(argv)
    # TF_CONFIG (set by cluster launchers) fills the cluster flags not given; --horovod and --prepare-data ignore it
    args.task_role = None
    if args.sync:
        sync_cluster(p, args)
    elif not (args.horovod or args.prepare_data):
        try:
            role = ttf.distribute.Cluster.from_flags(
                ttf.distribute.Cluster.from_env(), ps_hosts=args.ps_hosts, worker_hosts=args.worker_hosts,
                chief_host=args.chief_host, task_type="chief", task_types=("chief",), shapes=("parameter-server",),
                names={"ps_hosts": "--ps-hosts", "worker_hosts": "--worker-hosts", "chief_host": "--chief-host"})
        except ttf.distribute.ClusterError as err:
            hint = " (add --sync --tiacc for a synchronous job)" if "synchronous job" in str(err) else ""
            p.error(str(err) + hint)
        args.ps_hosts, args.worker_hosts, args.chief_host = (role.hosts("ps") or None, role.hosts("worker") or None,
                                                             role.chief_host or None)
        args.task_role = role.describe() if role.ps_hosts and role.worker_hosts and role.chief_host else None
    if args.horovod and (args.ps_hosts or args.tfra):
        p.error("--horovod runs the native or ttf (--tiacc) path without parameter servers; "
                "drop --ps-hosts/--worker-hosts/--chief-host and --tfra")
    if args.tfra and ctr.tfra_missing():
        p.error(ctr.tfra_missing())
    if args.horovod and args.epochs and args.steps_per_call > 1:
        p.error("--epochs on Horovod needs --steps-per-call 1: the ranks' shares may end a batch apart, and every "
                "rank checks before each step that all ranks still have a batch")
    if args.pipeline and not args.prepare_data and not ((args.horovod or args.sync) and args.tiacc):
        p.error("--pipeline overlaps the table exchange of a synchronous job: it needs --sync or --horovod, with --tiacc")
    if args.hvd_compression != "none" and not (args.horovod or args.sync):
        p.error("--wire-compression needs --sync or --horovod")
    if args.horovod and args.hvd_compression == "bf16" and not args.tiacc:
        p.error("--hvd-compression bf16 needs --tiacc (the native path uses horovod's DistributedOptimizer: none or fp16)")
    if args.publish_dir and not args.tiacc:
        p.error("--publish-dir publishes ttf tables: add --tiacc")
    for name in ("publish_every", "rebase_every"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(args, name)}")
    if not args.dense_publish_every >= 0:
        p.error(f"--dense-publish-every must be >= 0 seconds, got {args.dense_publish_every}")
    cluster_flags = [args.ps_hosts, args.worker_hosts, args.chief_host]
    if any(cluster_flags) and not all(cluster_flags) and not args.sync:
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
    check_data_paths(p, args)
    if not (math.isfinite(args.lr) and args.lr > 0):
        p.error(f"--lr must be a finite number > 0, got {args.lr}")
    if args.max_non_finite_steps < 0:
        p.error(f"--max-non-finite-steps must be >= 0, got {args.max_non_finite_steps}")
    args.table = table_config(p, args, schema)
    check_stream_args(p, args)
    if args.steps is None and args.epochs is None and not args.stream:
        args.steps = 200
    if args.precision is None:
        args.precision = "auto" if args.tiacc else "fp32"
    if args.export_dir and args.tfra:
        p.error("--export-dir writes a SavedModel of stock TensorFlow ops; TFRA's tables need TFRA's ops "
                "(use --tiacc or the native path)")
    return args


_TABLE_FLAGS = re.compile(r"\b(capacity|evict_policy|ttl_steps|dram_budget|ssd_dir)\b")
_ROWS = re.compile(r"\brows='(\w+)'")  # TableConfig's rows='int8' is --table-rows int8
_SLOTS = {"adam": 2, "ftrl": 2, "adagrad": 1, "sgd": 0}  # optimizer slots beside each table row


def table_config(p, args, schema):
    """--table-capacity .. --ssd-dir -> a ttf.embedding.TableConfig (None without --tiacc), its
    errors as one-line usage errors naming these flags."""
    text = args.table_capacity.strip()
    try:
        table = ttf.embedding.TableConfig(
            capacity=int(text) if text.isdigit() else text, evict_policy=args.evict_policy,  # digits: rows
            ttl_steps=args.ttl_steps, dram_budget=args.dram_budget, ssd_dir=args.ssd_dir, rows=args.table_rows)
        table.check_fits(args.embedding_dim + 1, _SLOTS[args.optimizer], args.batch_size * max(schema.num_fields, 1),
                         optimizer=args.optimizer)
    except ValueError as err:
        flag = {"capacity": "table-capacity"}
        message = _ROWS.sub(r"--table-rows \1", str(err))
        p.error(_TABLE_FLAGS.sub(lambda m: "--" + flag.get(m.group(1), m.group(1).replace("_", "-")), message))
    if (table.capacity or table.evict_policy == "ttl") and not args.tiacc:
        p.error("--table-capacity and --evict-policy ttl bound ttf tables: add --tiacc")
    if table.ssd_dir and not args.tiacc:
        p.error("--dram-budget and --ssd-dir tier ttf tables: add --tiacc")
    if table.rows != "fp32" and not args.tiacc:
        p.error(f"--table-rows {table.rows} stores ttf tables' rows: add --tiacc")
    return table if args.tiacc else None


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
    group.add_argument("--export-rows", choices=["fp32", "fp16", "int8"], default="fp32",
                       help="precision of the embedding rows in the serving export and in published deltas (default "
                            "fp32: predictions equal the trainer's; fp16 halves the rows' bytes; int8 stores each row "
                            "with a float scale and bias, about 0.4x the fp32 bytes, probabilities within 0.01)")
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
    group.add_argument("--dense-publish-every", type=float, default=0.0,
                       help="0 (default): the dense weights go with every delta in which they changed; S > 0: "
                            "at most every S seconds (served rows may then run S seconds ahead of them)")
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


def check_data_paths(p, args):
    """--data and --eval-data (files, globs or folders) of one format. A missing path or a folder
    without data files is the Reader's one-line error (exit 2) when train.py opens them."""
    formats = {}
    for flag, paths in (("--data", [] if args.synthetic else args.data), ("--eval-data", args.eval_data or [])):
        if paths:
            try:
                formats[flag] = ttf.data.data_format(ttf.data.expand_paths(paths))
            except (ValueError, OSError):
                continue  # raised again, as one line, by ttf.data.Reader in train.py
    if len(set(formats.values())) > 1:
        p.error(f"--data is {formats['--data']}, --eval-data {formats['--eval-data']}: give one format per job")


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


def sync_cluster(p, args):
    """--sync: the workers (chief first, if any) and this worker's rank, from the flags or TF_CONFIG."""
    if args.horovod or args.ps_hosts or args.chief_host or args.tfra or not args.tiacc:
        p.error("--sync shards ttf tables over TensorFlow's collectives: give --tiacc, without --horovod, --tfra, "
                "--ps-hosts and --chief-host")
    if args.steps_per_call > 1:
        p.error("--sync runs one step per call (each collective takes a new instance key at each call): "
                "drop --steps-per-call")
    try:
        role = ttf.distribute.Cluster.from_flags(
            ttf.distribute.Cluster.from_env(), worker_hosts=args.worker_hosts,
            task_type=None if args.task_index is None else "worker", task_index=args.task_index,
            task_types=("chief", "worker"), shapes=("synchronous",),
            names={"worker_hosts": "--worker-hosts", "task_index": "--task-index", "task_type": "--sync"})
    except ttf.distribute.ClusterError as err:
        p.error(str(err))
    if not role.worker_hosts or role.task_type is None:
        p.error("--sync needs --worker-hosts and --task-index (or TF_CONFIG with this task)")
    args.sync_hosts = list(role.ranks())  # the chief (if any) is rank 0
    args.sync_index = 0 if role.task_type == "chief" else bool(role.chief_host) + role.task_index
    if not 0 <= args.sync_index < len(args.sync_hosts):
        p.error(f"--task-index {role.task_index} is outside the {len(args.sync_hosts)} workers of --worker-hosts")
    args.task_role = role.describe()
