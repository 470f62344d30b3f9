#!/usr/bin/env bash
# A parameter-server job with one container per task on a container network: N ps, M workers
# and the chief, each running start_all.sh's multi-host role flags (--role/--index/--*-hosts).
# With --hvd: a synchronous Horovod job instead, one rank per container (start_all.sh --hvd
# --hvd-hosts/--hvd-host-index: Gloo rendezvous on the first container, no ssh).
# Checkpoints go to a volume mounted at /ckpt in every container; running the same job again
# with the same volume resumes from its last checkpoint. Run with -h for every option.
set -euo pipefail
SCRIPT=cluster
source "$(dirname "$0")/engine.sh"

usage() {
  cat <<'EOF'
Usage: docker/cluster.sh [options] [start_all.sh flags]

Runs a ttf parameter-server job in containers, one per task, on its own container network
(builds or updates the image first, with docker/build.sh).

  --ps N          parameter-server containers (default 1)
  --workers N     worker containers (default 2); with --hvd: Horovod ranks, one per container
  --hvd           a Horovod job: containers JOB-rank0.., tables sharded over the ranks, rank 0
                  saves checkpoints and prints the result
  --name JOB      job name (default ttf-job): containers JOB-ps0.., JOB-worker0.., JOB-chief on
                  the network JOB-net; they are removed when the job ends
  --volume V      named volume (or absolute host directory) for checkpoints, mounted at /ckpt
                  (default JOB-ckpt); the chief saves to /ckpt and resumes from it
  -h, --help      this help
Every other flag goes to start_all.sh in each container: model, path, --steps, --batch-size,
--metrics-out /ckpt/metrics.json, ... (paths are inside the containers; /ckpt is the volume).
Like start_all.sh it reports a worker that stops and lets the chief finish on the others, and
stops the job when a parameter server is lost (run it again to resume from the checkpoint).
Env: TTF_ENGINE, TTF_IMAGE (docker/build.sh -h), TTF_BUILD_FLAGS (extra build.sh flags),
TTF_START_TIMEOUT (seconds the server containers together may take to listen, default 300).

Examples:
  docker/cluster.sh --tiacc --fm                       # 1 ps + 2 workers + chief, DeepFM with ttf
  docker/cluster.sh --ps 2 --workers 3 --tiacc --fm --steps 1000 --name big
  docker/cluster.sh --hvd --workers 2 --tiacc --fm     # 2 Horovod ranks in 2 containers
EOF
}

usage_error() { echo "[cluster] $*" >&2; echo "Run docker/cluster.sh -h for usage." >&2; exit 2; }

num_ps=1 num_workers=2 job=ttf-job volume="" job_flags=() user_ckpt=0 hvd=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ps|--workers|--name|--volume) [ $# -ge 2 ] && [ -n "$2" ] || usage_error "$1 needs a value" ;;&
    --ps) num_ps=$2; shift ;;
    --workers) num_workers=$2; shift ;;
    --name) job=$2; shift ;;
    --volume) volume=$2; shift ;;
    --hvd) hvd=1 ;;
    --role|--index|--ps-hosts|--worker-hosts|--chief-host|--single|--hvd-hosts|--hvd-host-index|--hvd-rendezvous)
      usage_error "$1 is set by cluster.sh for each container; leave it out" ;;
    -h|--help) usage; exit 0 ;;
    *) [ "$1" = --checkpoint-dir ] && user_ckpt=1; job_flags+=("$1") ;;
  esac
  shift
done
[[ $num_ps =~ ^[1-9][0-9]*$ ]] && [[ $num_workers =~ ^[1-9][0-9]*$ ]] ||
  usage_error "--ps and --workers must be positive integers, got '$num_ps' and '$num_workers'"
[[ $job =~ ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$ ]] || usage_error "--name must be letters, digits, '_', '.', '-', got '$job'"
volume=${volume:-$job-ckpt}
[ "$user_ckpt" = 1 ] || job_flags+=(--checkpoint-dir /ckpt)

build_flags=()
read -r -a build_flags <<<"${TTF_BUILD_FLAGS:-}"
"$DOCKER_DIR/build.sh" ${build_flags[@]+"${build_flags[@]}"}
pick_engine no quiet
[ "$ENGINE" = podman ] && check_engine "$IMAGE"

network=$job-net port=2222
names=() roles=()
join_hosts() { local IFS=,; echo "$*"; }
hosts() { local prefix=$1 n=$2 list=(); for ((i = 0; i < n; i++)); do list+=("$job-$prefix$i:$port"); done; join_hosts "${list[@]}"; }
if [ "$hvd" = 1 ]; then
  for ((i = 0; i < num_workers; i++)); do names+=("$job-rank$i") roles+=("rank $i"); done
  port=1  # one rank per container: host:slots
  cluster=(--hvd --hvd-hosts "$(hosts rank "$num_workers")" --hvd-rendezvous "$job-rank0:29500")
else
  for ((i = 0; i < num_ps; i++)); do names+=("$job-ps$i") roles+=("ps $i"); done
  for ((i = 0; i < num_workers; i++)); do names+=("$job-worker$i") roles+=("worker $i"); done
  cluster=(--ps-hosts "$(hosts ps "$num_ps")" --worker-hosts "$(hosts worker "$num_workers")" --chief-host "$job-chief:$port")
fi

follower=""
remove_containers() {  # one by one: podman removes none of a list that names a missing container
  local name
  for name in "${names[@]}" "$job-chief"; do engine rm -f "$name" >/dev/null 2>&1 || true; done
}
cleanup() {
  trap - EXIT INT TERM
  [ -z "$follower" ] || kill "$follower" 2>/dev/null || true
  remove_containers
  engine network rm "$network" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'echo "[cluster] interrupted: removing the job'"'"'s containers"; exit 130' INT TERM

remove_containers  # left over from an earlier run of the same job
engine network inspect "$network" >/dev/null 2>&1 || engine network create "$network" >/dev/null 2>&1 ||
  fail "could not create the network $network ($ENGINE network create $network)"
if [[ $volume == /* ]]; then mkdir -p "$volume"; else
  engine volume inspect "$volume" >/dev/null 2>&1 || engine volume create "$volume" >/dev/null
fi

start_task() {  # name, role flags...: one detached container running start_all.sh in that role
  local name=$1 err; shift
  err=$(engine run -d --name "$name" --hostname "$name" --network "$network" --stop-timeout 2 \
    "${RUN_OPTS[@]}" -v "$volume:/ckpt" "$IMAGE" "${job_flags[@]}" "$@" "${cluster[@]}" 2>&1 >/dev/null) ||
    fail "could not start container $name: ${err##*$'\n'}"
}
running() { [ "$(engine inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }
# grep reads the whole log: with pipefail, `grep -q` would quit at the first match and the
# engine, still writing, would die of SIGPIPE and fail the test, so a listening server would
# never count as ready.
listening() { engine logs "$1" 2>&1 | grep -F "ready at" >/dev/null; }
exit_code() { engine inspect -f '{{.State.ExitCode}}' "$1" 2>/dev/null || echo "?"; }

# The hooks of scripts/job_watch.sh (the wait for servers and the watchdog start_all.sh uses too),
# for containers: task i is container names[i].
JOB_PREFIX=cluster NUM_PS=$num_ps TASK_NAMES=("${roles[@]}") TASK_WHERE=()
JOB_RESUME_HINT="run the job again with the same --volume to resume from its last checkpoint"
for name in "${names[@]}"; do TASK_WHERE+=("container $name"); done
task_running() { running "${names[$1]}"; }
task_listening() { listening "${names[$1]}"; }
task_exit_code() { TASK_EXIT_CODE=$(exit_code "${names[$1]}"); }
task_last_lines() { engine logs --tail "$2" "${names[$1]}" 2>&1; }
chief_running() { running "$job-chief"; }
source "$REPO_ROOT/scripts/job_watch.sh"

if [ "$hvd" = 1 ]; then
  echo "[cluster] Horovod job $job: $num_workers rank(s), one per container, on network $network, checkpoints in $volume"
  echo "[cluster] listening: $job-rank0 port 29500 (Gloo rendezvous, HTTP) and every rank's Gloo ports (TCP), on" \
       "network $network only (no host port published), no authentication; see SECURITY.md"
  for ((i = 0; i < num_workers; i++)); do start_task "${names[i]}" --hvd-host-index "$i"; done
  engine logs -f "${names[0]}" 2>&1 | grep --line-buffered -v -E '^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+: [IWE] ' &
  follower=$!
  alive=() failed=0
  for ((i = 0; i < num_workers; i++)); do alive[i]=1; done
  left=$num_workers
  while [ "$left" -gt 0 ]; do  # until every rank's container stopped; a failed rank stops the others
    sleep 2
    for ((i = 0; i < num_workers; i++)); do
      [ "${alive[i]}" = 1 ] && ! running "${names[i]}" || continue
      alive[i]=0 left=$((left - 1))
      [ "$(exit_code "${names[i]}")" = 0 ] || { failed=1; report_stop "$i"; }
    done
  done
  wait "$follower" 2>/dev/null || true
  follower=""
  if [ "$failed" = 1 ]; then
    echo "[cluster] the Horovod job failed; run it again with the same --volume to resume from its last checkpoint" >&2
    exit 1
  fi
  echo "[cluster] done; checkpoints in $volume"
  exit 0
fi

echo "[cluster] job $job: $num_ps ps + $num_workers worker(s) + chief on network $network, checkpoints in $volume"
echo "[cluster] listening: port $port of every container on network $network only (no host port published;" \
     "TensorFlow gRPC, no authentication); see SECURITY.md"
for ((i = 0; i < ${#names[@]}; i++)); do
  read -r role index <<<"${roles[i]}"
  start_task "${names[i]}" --role "$role" --index "$index"
done
wait_until_listening || exit 1
echo "[cluster] servers ready; starting the chief ($job-chief)"
start_task "$job-chief" --role chief
# The chief's output, less TensorFlow's start-up chatter on stderr (as start_all.sh keeps it out).
engine logs -f "$job-chief" 2>&1 | grep --line-buffered -v -E '^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+: [IWE] ' &
follower=$!

watch_job 2 || exit 1
wait "$follower" 2>/dev/null || true
follower=""
rc=$(exit_code "$job-chief")
if [ "$rc" != 0 ]; then echo "[cluster] the chief failed (exit code $rc)" >&2; exit 1; fi
echo "[cluster] done; checkpoints in $volume"
