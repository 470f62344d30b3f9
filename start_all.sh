#!/usr/bin/env bash
# Starts a ttf training job: by default a local parameter-server cluster (1 ps + 2 workers +
# the chief, on free localhost ports) training Wide&Deep on synthetic Criteo-schema data
# (written to data/cache on first use) and printing the AUC beside the best achievable one.
# Run with -h for every flag. Sets itself up on first use (./.venv, packages, op build).
set -euo pipefail
# Ctrl-C exits 130 in every phase, the set-up too (each phase below replaces this with its own stop).
trap 'echo "[start_all] interrupted"; exit 130' INT
cd "$(dirname "$0")"
start_all_args=("$@")  # kept to run again inside the private network namespace
# TTF_NETWORK counts only when private_network.py set it for this very process (the same pid).
[ "${TTF_NETWORK_PID:-}" = "$$" ] || unset TTF_NETWORK

usage() {
  cat <<'EOF'
Usage: ./start_all.sh [options]

Model and path:
  --fm                 DeepFM (default: Wide&Deep)
  --tiacc              the ttf path: FusedEmbedding + ttf.optimizers (default: native TensorFlow)
  --tfra               the TFRA path (dynamic_embedding layers + its optimizer wrapper)
  --precision P        auto | loss | fp32 | bf16: dense-part precision (default auto with --tiacc, else fp32;
                       auto = loss on a CPU with native bf16, fp32 elsewhere)
  --optimizer O        adam | adagrad | ftrl | sgd (default adam)
  --lr LR              learning rate (default: train.py's, 0.001)
  --table-capacity N   with --tiacc: rows each process's shard of each table keeps (LRU unless
                       --evict-policy; 0 = unbounded, the default); with a unit (512M, 2G) bytes
                       of rows instead (value, optimizer slots, metadata, index; not with --dram-budget)
  --evict-policy P     with --tiacc: lru | lfu | ttl (ttl needs --ttl-steps S)
  --ttl-steps S        with --evict-policy ttl: steps without an update before an id is evicted
  --dram-budget SIZE   with --tiacc: DRAM + SSD tier, bytes of DRAM rows per process's table shard
                       (e.g. 2G, 512M); the rest live under --ssd-dir (0 = all in DRAM, the default)
  --ssd-dir DIR        with --dram-budget: a writable directory for the disk tier's (unlinked) files
  --table-rows R       with --tiacc: fp32 | bf16 | int8 rows (and optimizer slots to match) in every
                       process's tables, any topology (docs/table_rows.md; default fp32)
Data:
  --schema S           criteo (default) | avazu | a JSON schema file: the data's columns
  --data D             synthetic (default): rows of a planted model of --schema, written to
                       data/cache on first use; the best achievable AUC is printed beside
                       the AUC reached | sample: the bundled real rows (data/<schema>_sample.txt)
                       | FILE...: files of --schema (text plain or .gz, .parquet, .tfrecord[.gz]),
                       a quoted glob, or a folder of part files (hidden, _* and *.crc skipped)
  --synthetic-rows N   rows of the synthetic data, every 5th held out (default 200000)
  --eval-data FILE...  eval data, as --data (default: every 5th row of --data, held out)
  --stream SPEC        train on a stream until SIGTERM instead of --data: folder:DIR (files renamed
                       into DIR) or kafka:HOST:PORT/TOPIC. In a PS job the chief reads it; with
                       --hvd each rank reads its share. SIGTERM makes the job finish its step or
                       round, publish, checkpoint (stream position included) and exit 0, then the
                       servers stop (docs/streams.md)
Training:
  --steps N            global steps (default 200)
  --epochs N           passes over --data instead of --steps: each worker (or Horovod rank) reads
                       its own share, so one epoch trains each row once across the job
  --batch-size N       examples per step and worker (default 256)
  --checkpoint-dir D   save checkpoints here; a restart with the same D resumes
  --checkpoint-every N steps between checkpoints (default 100)
  --full-every M       every M-th checkpoint is full, the others deltas: rows touched since the
                       last checkpoint + evicted ids (default 1: all full)
  --export-dir D       after training, write a SavedModel for serving that needs only stock
                       TensorFlow (signature serving_default: ids, dense -> probability)
  --metrics-out FILE   write the final metrics as JSON
  --logdir D           write TensorBoard scalars (loss, rolling AUC, examples/s, rows per table, ...)
                       here, from the chief / rank 0; watch with `tensorboard --logdir D`
  --publish-dir BASE   publish to serving while training: a base version in TF Serving's layout
                       (BASE/<version>/), then deltas of the touched rows every --publish-every S
                       (default 10); --dense-publish-every S (0), --rebase-every S (3600),
                       --export-rows fp32|fp16|int8 (docs/serving.md); with --stream: --stream-poll S,
                       --stream-journal FILE, --kafka-config FILE (TLS/SASL settings), --ttl-seconds S
                       (event-time TTL) (docs/streams.md)
  --lenient            skip and count bad input lines instead of stopping at the first
  --verbose            show TensorFlow's own log lines (hidden by default)
Local job (default: a parameter-server cluster on this host):
  --ps N               parameter servers (default 1)
  --workers N          workers (default 2)
  --single             one process, no cluster
  --no-isolation       run the local cluster or local Horovod job in this host's network: its servers
                       then listen on every interface, unauthenticated (default: a private network
                       namespace holding only loopback, where the kernel allows one; see SECURITY.md)
Synchronous job on TensorFlow's own collectives (any TensorFlow, Keras 2 or 3; ttf tables sharded over
the workers by id, dense gradients allreduced; docs/sync.md):
  --sync               N workers on this host (N = --workers, default 2), each models/train.py --sync
                       (needs --tiacc); --hvd-compression sets what crosses the wire
Horovod job (synchronous data parallel; ttf tables sharded over the ranks by id; TensorFlow 2.16 only):
  --hvd                N ranks on this host through `horovodrun --gloo` (N = --workers, default 2);
                       installs horovod on first use (scripts/setup_horovod.sh, ~6 min build once)
  --hvd-compression C  none | fp16 | bf16: what crosses the wire between ranks (default none)
  --hvd-hosts H        multi-host: host:ranks,host:ranks of every host (same on each host), e.g.
                       10.0.0.1:2,10.0.0.2:2; run once per host with --hvd-host-index, no ssh needed
  --hvd-host-index I   this host's position in --hvd-hosts (host 0 serves the Gloo rendezvous)
  --hvd-rendezvous A   address:port of the rendezvous server on host 0 (default <host 0>:29500)
  --hvd-iface IF       network interface Gloo uses on this host (default: the one holding its address)
One role of a multi-host job (run once per task, on its host; or set TF_CONFIG instead, below):
  --role R             chief | worker | ps
  --index I            the task's index within its role (default 0)
  --ps-hosts H         host:port,host:port of every ps task
  --worker-hosts H     host:port,... of every worker task
  --chief-host H       host:port of the chief
  -h, --help           this help
  --script FILE        run your own script (a ttf.distribute.Job chief) instead of models/train.py: as the
                       chief of the local parameter-server cluster, with TF_CONFIG naming the cluster and
                       its chief role (ttf.distribute.ParameterServers() reads it: ttf.distribute.Cluster),
                       or alone with --single; ARGS after -- go to it (docs/job.md)
  -- ARGS              pass ARGS to models/train.py as they are (any of its flags: python models/train.py -h)

Examples:
  ./start_all.sh --tiacc --fm                        # DeepFM with ttf, local PS cluster, synthetic data
  ./start_all.sh --tiacc --fm --data sample          # the same on the 200 bundled real Criteo rows
  ./start_all.sh --tiacc --schema avazu --single     # Avazu-schema synthetic data, one process
  ./start_all.sh --fm --single --steps 500           # native DeepFM in one process
  ./start_all.sh --tiacc --single --stream folder:/data/incoming --checkpoint-dir ck  # online, until SIGTERM
  ./start_all.sh --hvd --tiacc --fm                  # DeepFM with ttf on 2 Horovod ranks
  ./start_all.sh --sync --tiacc --fm                 # the same on TensorFlow's collectives, 2 workers
  ./start_all.sh --role ps --index 0 --ps-hosts 10.0.0.1:2222 --worker-hosts 10.0.0.2:2222 \
                 --chief-host 10.0.0.3:2222          # the ps task of a 3-host job
It prints the ports each task listens on at start-up, global steps/sec and AUC at the end. Logs of a
local cluster go to runs/<time>/.
TF_CONFIG: when set (TensorFlow's convention, as Kubernetes launchers, Vertex AI, SageMaker and Ray set it:
  {"cluster": {"chief": [...], "worker": [...], "ps": [...]}, "task": {"type": "worker", "index": 0}}), this
  task's role and the cluster come from it: a parameter-server job (chief, worker, ps) or a synchronous one
  (workers only, or chief + workers: every task runs models/train.py --sync). --role, --index and the
  hosts flags given as well must agree with it; --single, --hvd, --ps and --workers start a local job and
  ignore it (explicit flags win). docs/kubernetes.md has manifests that set it.
Env: TTF_TF (TensorFlow to run on: unset = the newest, 2.16 = TensorFlow 2.16 with TFRA), TTF_VENV
(virtual environment, default ./.venv; ./.venv-tf$TTF_TF with TTF_TF), PYTHON (its interpreter),
TTF_START_TIMEOUT (seconds the local cluster's servers may take to listen, default 300).
EOF
}

die() { echo "start_all: $*" >&2; echo "Run ./start_all.sh -h for usage." >&2; exit 2; }

given_args=()  # flags train.py takes as they are (and checks: one usage line, exit 2)
lr="" model=wdl path_flag="" precision="" optimizer=adam steps=200 epochs="" batch=256 data=() ckpt="" metrics="" eval_data=() logdir=""
schema="" synthetic_rows="" lenient=0 verbose=0
extra_train_args=() sync=0 hvd=0 hvd_compression="" hvd_hosts="" hvd_host_index="" hvd_rendezvous="" hvd_iface=""
ckpt_every="" full_every="" export_dir="" stream="" steps_given=0
isolation=1 num_ps=1 num_workers=2 single=0 role="" index=0 ps_hosts="" worker_hosts="" chief_host=""
local_flag="" index_given=0 job_shape=parameter-server script=""
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --fm) model=fm ;;
    --wdl) model=wdl ;;
    --tiacc) path_flag=--tiacc ;;
    --tfra) path_flag=--tfra ;;
    --single) single=1 local_flag=$1 ;;
    --no-isolation) isolation=0 ;;
    --hvd) hvd=1 local_flag=$1 ;;
    --sync) sync=1 local_flag=$1 ;;
    --hvd-compression) need_value "$@"; hvd_compression=$2; shift ;;
    --hvd-hosts) need_value "$@"; hvd_hosts=$2; shift ;;
    --hvd-host-index) need_value "$@"; hvd_host_index=$2; shift ;;
    --hvd-rendezvous) need_value "$@"; hvd_rendezvous=$2; shift ;;
    --hvd-iface) need_value "$@"; hvd_iface=$2; shift ;;
    --precision) need_value "$@"; precision=$2; shift ;;
    --optimizer) need_value "$@"; optimizer=$2; shift ;;
    --lr) need_value "$@"; lr=$2; shift ;;
    --table-capacity|--evict-policy|--ttl-steps|--dram-budget|--ssd-dir|--table-rows) need_value "$@"; given_args+=("$1" "$2"); shift ;;
    --steps) need_value "$@"; steps=$2; steps_given=1; shift ;;
    --stream) need_value "$@"; stream=$2; shift ;;
    --epochs) need_value "$@"; epochs=$2; shift ;;
    --batch-size) need_value "$@"; batch=$2; shift ;;
    # Several files, a glob (quoted) or a folder of part files: every value up to the next flag.
    --data) need_value "$@"; data=("$2"); shift; while [ $# -gt 1 ] && [[ $2 != -* ]]; do data+=("$2"); shift; done ;;
    --eval-data) need_value "$@"; eval_data=("$2"); shift
      while [ $# -gt 1 ] && [[ $2 != -* ]]; do eval_data+=("$2"); shift; done ;;
    --schema) need_value "$@"; schema=$2; shift ;;
    --synthetic-rows) need_value "$@"; synthetic_rows=$2; shift ;;
    --lenient) lenient=1 ;;
    --script) need_value "$@"; script=$2; shift ;;
    --verbose) verbose=1 ;;
    --checkpoint-dir) need_value "$@"; ckpt=$2; shift ;;
    --checkpoint-every) need_value "$@"; ckpt_every=$2; shift ;;
    --full-every) need_value "$@"; full_every=$2; shift ;;
    --export-dir) need_value "$@"; export_dir=$2; shift ;;
    --metrics-out) need_value "$@"; metrics=$2; shift ;;
    --logdir) need_value "$@"; logdir=$2; shift ;;
    --publish-dir|--publish-every|--dense-publish-every|--rebase-every|--export-rows|--stream-poll|--stream-journal|--kafka-config|--ttl-seconds)
      need_value "$@"; given_args+=("$1" "$2"); shift ;;
    --ps) need_value "$@"; num_ps=$2; local_flag=$1; shift ;;
    --workers) need_value "$@"; num_workers=$2; local_flag=$1; shift ;;
    --role) need_value "$@"; role=$2; shift ;;
    --index) need_value "$@"; index=$2; index_given=1; shift ;;
    --ps-hosts) need_value "$@"; ps_hosts=$2; shift ;;
    --worker-hosts) need_value "$@"; worker_hosts=$2; shift ;;
    --chief-host) need_value "$@"; chief_host=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra_train_args=("$@"); break ;;
    *) die "unknown option '$1'" ;;
  esac
  shift
done
[ -n "$epochs" ] && { [[ $epochs =~ ^[1-9][0-9]*$ ]] || die "--epochs must be a positive integer, got '$epochs'"; }
for n in steps batch num_ps num_workers index; do
  [[ ${!n} =~ ^[0-9]+$ ]] || die "--${n//_/-} must be a non-negative integer, got '${!n}'"
done
[ "$num_ps" -ge 1 ] && [ "$num_workers" -ge 1 ] || die "--ps and --workers must be at least 1"
case "$role" in ""|chief|worker|ps) ;; *) die "--role must be chief, worker or ps, got '$role'" ;; esac
# TF_CONFIG: this task's role and the cluster, merged with the flags given (which must agree) by
# ttf/launch/tf_config.py, run as a plain script (no TensorFlow import: a fraction of a second).
if [ -n "${TF_CONFIG:-}" ] && [ -z "${TTF_NETWORK:-}" ]; then
  if [ -n "$local_flag" ]; then
    echo "[start_all] TF_CONFIG is set, but $local_flag starts a local job: TF_CONFIG is ignored (explicit flags win)"
  else
    refuse() { echo "start_all: $*" >&2; exit 2; }  # a bad TF_CONFIG: one line, exit 2
    command -v python3 >/dev/null || refuse "reading TF_CONFIG needs python3 on PATH"
    merge=(--shell)
    for flag in role ps_hosts worker_hosts chief_host; do [ -n "${!flag}" ] && merge+=("--${flag//_/-}" "${!flag}"); done
    [ "$index_given" = 1 ] && merge+=(--index "$index")
    resolved=$(python3 ttf/launch/tf_config.py "${merge[@]}" 2>&1) || refuse "$resolved"
    eval "$resolved"  # role index ps_hosts worker_hosts chief_host job_shape role_line, shell-quoted
    echo "[start_all] $role_line"
    case "$role" in
      evaluator) refuse "TF_CONFIG names an evaluator task: ttf's jobs evaluate on the chief (--eval-data, --export-dir); run no evaluator" ;;
    esac
  fi
fi
if [ -n "$role" ] && [ "$job_shape" = parameter-server ] && { [ -z "$ps_hosts" ] || [ -z "$worker_hosts" ] || [ -z "$chief_host" ]; }; then
  die "--role needs --ps-hosts, --worker-hosts and --chief-host"
fi

if [ -n "$script" ]; then
  [ -f "$script" ] || die "--script $script: no such file"
  { [ "$hvd" = 1 ] || [ "$sync" = 1 ] || [ -n "$role" ]; } &&
    die "--script runs your script as the chief of the local parameter-server cluster, or alone with --single;" \
        "drop --hvd/--sync/--role (a synchronous job runs your script on every worker: docs/job.md)"
fi
if [ "$hvd" = 1 ]; then
  { [ -n "$role" ] || [ "$single" = 1 ] || [ "$path_flag" = --tfra ]; } &&
    die "--hvd runs the native or --tiacc path on Horovod ranks; drop --role/--single/--tfra"
  [ -n "$hvd_hosts" ] && [ -z "$hvd_host_index" ] && die "--hvd-hosts needs --hvd-host-index"
elif [ "$sync" = 1 ]; then
  { [ -n "$role" ] || [ "$single" = 1 ] || [ "$path_flag" != --tiacc ]; } &&
    die "--sync runs the --tiacc path on workers of this host; add --tiacc, drop --role/--single"
  [ -n "$hvd_hosts$hvd_host_index$hvd_rendezvous$hvd_iface" ] && die "--hvd-hosts and the other --hvd-* flags need --hvd"
elif [ -n "$hvd_compression$hvd_hosts$hvd_host_index$hvd_rendezvous$hvd_iface" ]; then
  die "--hvd-compression needs --hvd or --sync; --hvd-hosts, --hvd-host-index, --hvd-rendezvous and --hvd-iface need --hvd"
fi

venv=${TTF_VENV:-$PWD/.venv${TTF_TF:+-tf$TTF_TF}}
PY=$venv/bin/python
if [ -z "${TTF_NETWORK:-}" ]; then  # (set inside the private network namespace: set up already)
  echo "[start_all] set-up: checking $venv and the op build"
  ./scripts/setup_env.sh
  [ "$hvd" = 1 ] && ./scripts/setup_horovod.sh
  [ -x "$PY" ] || { echo "start_all: no Python at $PY after the set-up; check TTF_VENV" >&2; exit 1; }
fi

# A local job's servers (TensorFlow's gRPC, Horovod's rendezvous and Gloo) listen on every address
# with no authentication: the whole job runs again, same pid, in a private network namespace
# whose only interface is loopback (TTF_NETWORK=private there, or "refused: why").
if [ -z "$role" ] && [ "$single" = 0 ] && [ -z "$hvd_hosts" ] && [ "$isolation" = 1 ] && [ -z "${TTF_NETWORK:-}" ]; then
  TTF_NETWORK_PID=$$ exec "$PY" ttf/launch/private_network.py -- "$BASH" "$PWD/start_all.sh" ${start_all_args[@]+"${start_all_args[@]}"}
fi
rank_pids() {  # PID: the Python processes of models/train.py below PID (horovodrun's ranks); reads /proc only
  local status pid
  for status in /proc/[0-9]*/status; do
    [ "$(sed -n 's/^PPid:[[:space:]]*//p' "$status" 2>/dev/null)" = "$1" ] || continue
    pid=${status#/proc/}; pid=${pid%/status}
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
      python*) tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "models/train.py" && echo "$pid" ;;
    esac
    rank_pids "$pid"
  done
}

network_line() {  # PORTS PROTOCOLS: one line saying where the local job's servers listen, and who can reach them
  case "${TTF_NETWORK:-}" in
    private) echo "[start_all] listening: $1 on every address of this job's private network namespace ($2," \
                  "no authentication): loopback only, reachable by no process outside the job" ;;
    *) local why="--no-isolation"
       [ -n "${TTF_NETWORK:-}" ] && why="the kernel refused a private network namespace: ${TTF_NETWORK#refused: }"
       echo "[start_all] warning: not isolated ($why); $1 listen on ALL interfaces ($2, no authentication:" \
            "whoever reaches them can run code as $(id -un)); see SECURITY.md" ;;
  esac
}

train_args=(--model "$model" --optimizer "$optimizer" --batch-size "$batch")
if [ -n "$epochs" ]; then train_args+=(--epochs "$epochs")
elif [ -n "$stream" ]; then train_args+=(--stream "$stream"); [ "$steps_given" = 1 ] && train_args+=(--steps "$steps")
else train_args+=(--steps "$steps"); fi
[ -n "$precision" ] && train_args+=(--precision "$precision")
[ -n "$lr" ] && train_args+=(--lr "$lr")
train_args+=(${given_args[@]+"${given_args[@]}"})
[ -n "$path_flag" ] && train_args+=("$path_flag")
[ ${#data[@]} -gt 0 ] && train_args+=(--data "${data[@]}")
[ ${#eval_data[@]} -gt 0 ] && train_args+=(--eval-data "${eval_data[@]}")
[ -n "$ckpt" ] && train_args+=(--checkpoint-dir "$ckpt")
[ -n "$ckpt_every" ] && train_args+=(--checkpoint-every "$ckpt_every")
[ -n "$full_every" ] && train_args+=(--full-every "$full_every")
[ -n "$export_dir" ] && train_args+=(--export-dir "$export_dir")
[ -n "$metrics" ] && train_args+=(--metrics-out "$metrics")
[ -n "$logdir" ] && train_args+=(--logdir "$logdir")
[ -n "$schema" ] && train_args+=(--schema "$schema")
[ -n "$synthetic_rows" ] && train_args+=(--synthetic-rows "$synthetic_rows")
[ "$lenient" = 1 ] && train_args+=(--lenient)
[ "$verbose" = 1 ] && train_args+=(--verbose)
train_args+=(${extra_train_args[@]+"${extra_train_args[@]}"})

# TFRA's kernels must be registered in the servers too (ttf's are always loaded there).
server_imports=()
[ "$path_flag" = --tfra ] && server_imports=(--import tensorflow_recommenders_addons.dynamic_embedding)

if [ "$hvd" = 1 ]; then
  train_args+=(--horovod)
  [ -n "$hvd_compression" ] && train_args+=(--hvd-compression "$hvd_compression")
  if [ -n "$hvd_hosts" ]; then  # one host of a multi-host job: its ranks, Gloo rendezvous by environment
    launch=(--hosts "$hvd_hosts" --host-index "$hvd_host_index")
    [ -n "$hvd_rendezvous" ] && launch+=(--rendezvous "$hvd_rendezvous")
    [ -n "$hvd_iface" ] && launch+=(--iface "$hvd_iface")
    echo "[start_all] Horovod host $hvd_host_index of $hvd_hosts: training (${train_args[*]})"
    exec "$PY" -m ttf.launch.hvdrun "${launch[@]}" -- "$PY" models/train.py "${train_args[@]}"
  fi
  logdir=runs/$(date +%Y%m%d-%H%M%S)-$$-hvd
  mkdir -p "$logdir"
  echo "[start_all] Horovod: $num_workers rank(s) on this host via horovodrun --gloo, logs in $logdir;" \
       "training (${train_args[*]})"
  network_line "horovodrun's rendezvous server and every rank's Gloo ports (picked at start-up)" "HTTP and Gloo TCP"
  "$venv/bin/horovodrun" --gloo -np "$num_workers" -H "localhost:$num_workers" \
    "$PY" models/train.py "${train_args[@]}" > >(tee "$logdir/horovodrun.log") 2>&1 &
  hvdrun=$!
  stop_horovodrun() {  # horovodrun stops its ranks; after a Ctrl-C during training it may then hang: 10 s
    kill "$hvdrun" 2>/dev/null || true
    for ((t = 0; t < 20; t++)); do kill -0 "$hvdrun" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$hvdrun" 2>/dev/null || true
    wait 2>/dev/null || true
  }
  trap stop_horovodrun EXIT
  trap 'echo "[start_all] interrupted: stopping every rank"; exit 130' INT TERM
  if [ -n "$stream" ]; then  # SIGTERM: every rank finishes its step, publishes and checkpoints, exits 0
    # (to the ranks themselves: horovodrun gives them 5 s before SIGKILL, too short for a save)
    trap 'echo "[start_all] SIGTERM: the ranks finish their step, publish and checkpoint"
          kill -TERM $(rank_pids "$hvdrun") 2>/dev/null || true' TERM
  fi
  rc=0
  wait "$hvdrun" || rc=$?
  while [ -n "$stream" ] && kill -0 "$hvdrun" 2>/dev/null; do  # a trapped SIGTERM ends the wait early
    rc=0; wait "$hvdrun" || rc=$?
  done
  if [ "$rc" != 0 ]; then
    failed=$(grep -o -E "Process [0-9]+ exit with status code -?[0-9]+" "$logdir/horovodrun.log" | head -n 1 || true)
    if [ -n "$failed" ]; then
      read -r _ rank _ _ _ _ code <<<"$failed"
      why="exit code $code"  # a negative code, or 128 + N from the shell horovodrun runs it in: signal N
      if [ "${code#-}" != "$code" ]; then why="killed by signal ${code#-}"
      elif [ "$code" -gt 128 ]; then why="killed by signal $((code - 128))"; fi
      echo "[start_all] Horovod rank $rank stopped ($why); horovodrun stopped the other ranks." \
           "Restart with the same --checkpoint-dir to resume from the last checkpoint. Log: $logdir/horovodrun.log" >&2
    else
      echo "[start_all] the Horovod job failed (exit code $rc); log: $logdir/horovodrun.log" >&2
    fi
    exit 1
  fi
  echo "[start_all] done; logs in $logdir"
  exit 0
fi

if [ "$sync" = 1 ]; then  # N workers of a synchronous job on this host, in step over TensorFlow's collectives
  [ -n "$hvd_compression" ] && train_args+=(--hvd-compression "$hvd_compression")
  logdir=runs/$(date +%Y%m%d-%H%M%S)-$$-sync
  mkdir -p "$logdir"
  read -r -a ports <<<"$("$PY" -c "
import socket
socks = [socket.socket() for _ in range($num_workers)]
for s in socks: s.bind(('127.0.0.1', 0))
print(*[s.getsockname()[1] for s in socks])")"
  hosts=$(printf '127.0.0.1:%s,' "${ports[@]}"); hosts=${hosts%,}
  echo "[start_all] synchronous job: $num_workers worker(s) on TensorFlow's collectives, logs in $logdir;" \
       "training (${train_args[*]})"
  network_line "the workers' gRPC ports ${ports[*]}" "TensorFlow gRPC"
  if [ -z "$stream" ] && { [ ${#data[@]} -eq 0 ] || [ "${data[0]}" = synthetic ]; }; then  # once, before the workers read it
    "$PY" models/train.py "${train_args[@]}" --prepare-data || exit 1
  fi
  pids=()
  for ((i = 0; i < num_workers; i++)); do
    if [ "$i" = 0 ]; then  # worker 0 prints the job's lines
      "$PY" models/train.py "${train_args[@]}" --sync --worker-hosts "$hosts" --task-index 0 \
        > >(tee "$logdir/worker0.log") 2>"$logdir/worker0.err" &
    else
      "$PY" models/train.py "${train_args[@]}" --sync --worker-hosts "$hosts" --task-index "$i" \
        >"$logdir/worker$i.log" 2>&1 &
    fi
    pids+=($!)
  done
  stop_workers() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
  trap stop_workers EXIT
  trap 'echo "[start_all] interrupted: stopping every worker"; exit 130' INT
  # SIGTERM: every worker finishes its step, publishes and checkpoints (a stream job), then exits 0.
  trap 'echo "[start_all] SIGTERM: the workers finish their step and checkpoint"; kill -TERM "${pids[@]}" 2>/dev/null || true' TERM
  rc=0 failed=""
  for ((i = 0; i < num_workers; i++)); do
    code=0
    wait "${pids[i]}" || code=$?
    while [ "$code" -gt 128 ] && kill -0 "${pids[i]}" 2>/dev/null; do code=0; wait "${pids[i]}" || code=$?; done
    if [ "$code" != 0 ] && [ -z "$failed" ]; then failed="worker $i (exit code $code)"; rc=$code; fi
  done
  trap - EXIT
  if [ -n "$failed" ]; then
    echo "[start_all] the synchronous job failed: first $failed; logs in $logdir:" >&2
    grep -h -v -E "^(WARNING|I0000|W0000|E0000)" "$logdir"/worker*.err "$logdir"/worker[1-9]*.log 2>/dev/null |
      grep -E "error|Error" | head -n 5 | sed 's/^/    /' >&2
    exit 1
  fi
  echo "[start_all] done; logs in $logdir"
  exit 0
fi

# A task of a synchronous job (TF_CONFIG with workers only, or chief + workers): every task trains, on
# TensorFlow's collectives, reading TF_CONFIG itself.
if [ -n "$role" ] && [ "$job_shape" = synchronous ]; then
  echo "[start_all] $role $index of a synchronous job: training (${train_args[*]} --sync)"
  exec "$PY" models/train.py "${train_args[@]}" --sync
fi

# One role of a multi-host job: this process becomes that task.
if [ -n "$role" ]; then
  cluster=(--ps-hosts "$ps_hosts" --worker-hosts "$worker_hosts" --chief-host "$chief_host")
  case $role in chief) role_hosts=$chief_host ;; ps) role_hosts=$ps_hosts ;; worker) role_hosts=$worker_hosts ;; esac
  IFS=, read -r -a role_hosts <<<"$role_hosts"
  [ "$index" -lt "${#role_hosts[@]}" ] || die "--index $index is outside the ${#role_hosts[@]} $role task(s)"
  echo "[start_all] $role $index: listens on 0.0.0.0:${role_hosts[index]##*:}, every address of this host" \
       "(TensorFlow gRPC, no authentication: whoever reaches it can run code as $(id -un)); see SECURITY.md"
  if [ "$role" = chief ]; then
    echo "[start_all] chief: training (${train_args[*]})"
    exec "$PY" models/train.py "${train_args[@]}" "${cluster[@]}"
  fi
  if [ "$role" = worker ] && [ -z "$stream" ] && { [ ${#data[@]} -eq 0 ] || [ "${data[0]}" = synthetic ]; }; then
    echo "[start_all] worker $index: preparing the synthetic data the chief trains on"
    "$PY" models/train.py "${train_args[@]}" --prepare-data
  fi
  echo "[start_all] $role $index: starting its TensorFlow server"
  exec "$PY" -m ttf.launch.server --job "$role" --index "$index" "${cluster[@]}" ${server_imports[@]+"${server_imports[@]}"}
fi

if [ "$single" = 1 ]; then
  if [ -n "$script" ]; then
    echo "[start_all] single process: $script ${extra_train_args[*]}"
    exec "$PY" "$script" ${extra_train_args[@]+"${extra_train_args[@]}"}
  fi
  echo "[start_all] single process: training (${train_args[*]})"
  exec "$PY" models/train.py "${train_args[@]}"
fi

# A local cluster: servers in the background, the chief in the foreground, a watchdog between.
logdir=runs/$(date +%Y%m%d-%H%M%S)-$$
mkdir -p "$logdir"
# Free ports: bind to port 0 and read what the kernel gave (without importing TensorFlow).
read -r -a ports <<<"$("$PY" -c "
import socket
socks = [socket.socket() for _ in range($num_ps + $num_workers + 1)]
for s in socks: s.bind(('127.0.0.1', 0))
print(*[s.getsockname()[1] for s in socks])")"
[ "${#ports[@]}" -eq $((num_ps + num_workers + 1)) ] || { echo "start_all: could not pick free ports" >&2; exit 1; }
TASK_NAMES=() TASK_WHERE=() NUM_PS=$num_ps ps_list=() worker_list=() listing=()
for ((i = 0; i < num_ps; i++)); do TASK_NAMES+=("ps $i") ps_list+=("127.0.0.1:${ports[i]}"); done
for ((i = 0; i < num_workers; i++)); do TASK_NAMES+=("worker $i") worker_list+=("127.0.0.1:${ports[num_ps + i]}"); done
for ((i = 0; i <= num_ps + num_workers; i++)); do listing+=("${TASK_NAMES[i]:-chief} port ${ports[i]}"); done
join_hosts() { local IFS=,; echo "$*"; }
cluster=(--ps-hosts "$(join_hosts "${ps_list[@]}")" --worker-hosts "$(join_hosts "${worker_list[@]}")"
         --chief-host "127.0.0.1:${ports[num_ps + num_workers]}")

pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo "[start_all] interrupted: stopping every process"; exit 130' INT TERM

# The hooks of scripts/job_watch.sh, for local processes.
JOB_PREFIX=start_all JOB_RESUME_HINT="restart with the same --checkpoint-dir to resume"
task_log() { echo "$logdir/${TASK_NAMES[$1]/ /}.log"; }
task_running() { kill -0 "${pids[$1]}" 2>/dev/null; }
task_listening() { grep -q "ready at" "$(task_log "$1")" 2>/dev/null; }
task_exit_code() { TASK_EXIT_CODE=0; wait "${pids[$1]}" 2>/dev/null || TASK_EXIT_CODE=$?; }
task_last_lines() { echo "($(task_log "$1"))"; tail -n "$2" "$(task_log "$1")"; }
chief_running() { kill -0 "$chief" 2>/dev/null; }
source scripts/job_watch.sh

echo "[start_all] cluster: $num_ps ps + $num_workers worker(s) on 127.0.0.1, logs in $logdir"
network_line "$(join_hosts "${listing[@]}" | sed 's/,/, /g')" "TensorFlow gRPC"
for ((i = 0; i < num_ps + num_workers; i++)); do
  read -r job index <<<"${TASK_NAMES[i]}"
  "$PY" -m ttf.launch.server --job "$job" --index "$index" "${cluster[@]}" ${server_imports[@]+"${server_imports[@]}"} \
    >"$logdir/$job$index.log" 2>&1 &
  pids+=($!) TASK_WHERE+=("pid $!")
done

wait_until_listening || exit 1
if [ -n "$script" ]; then  # the user's own chief: the cluster and its role in TF_CONFIG
  quoted() { local IFS=,; printf '"%s"' "$*" | sed 's/,/","/g'; }
  chief_config="{\"cluster\": {\"ps\": [$(quoted "${ps_list[@]}")], \"worker\": [$(quoted "${worker_list[@]}")],"
  chief_config+=" \"chief\": [\"127.0.0.1:${ports[num_ps + num_workers]}\"]}, \"task\": {\"type\": \"chief\", \"index\": 0}}"
  echo "[start_all] servers ready; chief: $script ${extra_train_args[*]} (TF_CONFIG: $chief_config)"
  TF_CONFIG=$chief_config "$PY" "$script" ${extra_train_args[@]+"${extra_train_args[@]}"} \
    2>"$logdir/chief.err" > >(tee "$logdir/chief.log") &
else
  echo "[start_all] servers ready; chief: training (${train_args[*]})"
  "$PY" models/train.py "${train_args[@]}" "${cluster[@]}" 2>"$logdir/chief.err" > >(tee "$logdir/chief.log") &
fi
chief=$!
pids+=($chief)
if [ -n "$stream" ]; then  # SIGTERM: the chief checkpoints (stream position included) and exits; then the servers stop
  trap 'echo "[start_all] SIGTERM: the chief finishes its round and checkpoints"; kill -TERM "$chief" 2>/dev/null || true
        rc=0; wait "$chief" || rc=$?; exit "$rc"' TERM
fi
watch_job 1 || exit 1
rc=0
wait "$chief" || rc=$?
if [ "$rc" != 0 ]; then
  if grep -q "^\[train\] error:" "$logdir/chief.log" 2>/dev/null; then  # train.py said why in one line (above)
    echo "[start_all] the chief failed (exit code $rc); TensorFlow's log of it: $logdir/chief.err" >&2
  else
    echo "[start_all] the chief failed (exit code $rc); its errors:" >&2
    grep -v -E "^(WARNING|I0000|W0000)" "$logdir/chief.err" | tail -n 15 | sed 's/^/    /' >&2
  fi
  exit "$rc"
fi
echo "[start_all] done; logs in $logdir"
