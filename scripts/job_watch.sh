# Sourced by start_all.sh (local processes) and docker/cluster.sh (containers): the one wait
# for a parameter-server job's servers to listen and the one watchdog while its chief trains.
# Not a command of its own.
#
# The caller sets
#   JOB_PREFIX        its log prefix (start_all, cluster)
#   TASK_NAMES[i]     "ps 0" .. then "worker 0" ..; the first NUM_PS are parameter servers
#   TASK_WHERE[i]     where task i runs, for messages ("pid 123", "container job-ps0")
#   NUM_PS            how many of TASK_NAMES are parameter servers
#   JOB_RESUME_HINT   how to resume after a lost parameter server
# and defines, for task i:
#   task_running i      true while it runs
#   task_listening i    true once it printed its "ready at" line
#   task_exit_code i    sets TASK_EXIT_CODE to its exit status (a number, or "?")
#   task_last_lines i N prints its last N log lines
#   chief_running       true while the chief runs
# Env: TTF_START_TIMEOUT, seconds every server together may take to listen (default 300: a
# loaded host needs minutes to import TensorFlow in several processes at once).

START_TIMEOUT=${TTF_START_TIMEOUT:-300}
if ! [[ $START_TIMEOUT =~ ^[1-9][0-9]*$ ]]; then
  echo "[$JOB_PREFIX] TTF_START_TIMEOUT must be a positive whole number of seconds, got '$START_TIMEOUT'" >&2
  exit 2
fi

report_stop() {  # i: why task i stopped, and its last lines
  local i=$1 why
  task_exit_code "$i"
  why="exit code $TASK_EXIT_CODE"
  [[ $TASK_EXIT_CODE =~ ^[0-9]+$ ]] && [ "$TASK_EXIT_CODE" -gt 128 ] && why="killed by signal $((TASK_EXIT_CODE - 128))"
  echo "[$JOB_PREFIX] ${TASK_NAMES[i]} (${TASK_WHERE[i]}) stopped: $why; its last lines:" >&2
  task_last_lines "$i" 5 | sed 's/^/    /' >&2
}

wait_until_listening() {  # returns 1, having said why, when a server stops or TTF_START_TIMEOUT passes
  local i deadline=$((SECONDS + START_TIMEOUT))
  for i in "${!TASK_NAMES[@]}"; do
    until task_listening "$i"; do
      task_running "$i" || { report_stop "$i"; return 1; }
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "[$JOB_PREFIX] ${TASK_NAMES[i]} (${TASK_WHERE[i]}) did not start within ${START_TIMEOUT}s" \
             "(TTF_START_TIMEOUT); its last lines:" >&2
        task_last_lines "$i" 10 | sed 's/^/    /' >&2
        return 1
      fi
      sleep 0.5
    done
  done
}

report_stopped_tasks() {  # reports each task of `alive` (watch_job's) that stopped since; sets STOPPED_PS
  local i
  for i in "${!TASK_NAMES[@]}"; do
    [ "${alive[i]}" = 1 ] && ! task_running "$i" || continue
    alive[i]=0
    report_stop "$i"
    if [ "$i" -lt "$NUM_PS" ]; then
      echo "[$JOB_PREFIX] parameter server lost: the chief stops with an error; $JOB_RESUME_HINT" >&2
      STOPPED_PS=1
    elif chief_running; then
      echo "[$JOB_PREFIX] the chief goes on with the remaining workers" >&2
    fi
  done
}

watch_job() {  # POLL_SECONDS: while the chief runs, reports every task that stops; returns 1 when
  # every worker is gone, or when the chief still runs 90 s after losing a parameter server
  local poll=$1 i alive=() ps_lost_at="" workers_alive
  for i in "${!TASK_NAMES[@]}"; do alive[i]=1; done
  STOPPED_PS=""
  while chief_running; do
    report_stopped_tasks
    if [ -n "$STOPPED_PS" ] && [ -z "$ps_lost_at" ]; then ps_lost_at=$SECONDS; fi
    if [ -n "$ps_lost_at" ] && [ $((SECONDS - ps_lost_at)) -gt 90 ]; then
      echo "[$JOB_PREFIX] the chief did not stop within 90s of losing a parameter server: stopping it" >&2
      return 1
    fi
    workers_alive=0
    for ((i = NUM_PS; i < ${#TASK_NAMES[@]}; i++)); do workers_alive=$((workers_alive + alive[i])); done
    if [ "$workers_alive" = 0 ]; then echo "[$JOB_PREFIX] every worker is gone: stopping the job" >&2; return 1; fi
    sleep "$poll"
  done
  report_stopped_tasks  # a task that stopped just before the chief (which then failed for it) is named too
}
