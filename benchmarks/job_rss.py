"""Peak RSS of every process of a job (issue 18: memory stays within what the user set, in
each process, and no process holds another's rows): runs COMMAND, follows its process tree
through /proc every --every seconds, and prints one JSON object: each Python process's role
(from its command line: "ps 0", "worker 1" (a PS task or a --sync worker), "chief" for
models/train.py, "rank" under Horovod), its peak RSS (VmHWM, MiB, at the last sample before
it exited) and the command's exit code. The command's own output goes to stderr.

    .venv/bin/python benchmarks/job_rss.py -- ./start_all.sh --tiacc --fm --ps 2 --dram-budget 32M \\
        --ssd-dir /tmp/ttf-ssd --synthetic-rows 1000000 --steps 1500 -- --synthetic-vocab 1000000
    TTF_TF=2.16 .venv/bin/python benchmarks/job_rss.py -- ./start_all.sh --hvd --tiacc --fm ...  # Horovod ranks

Exit code: the command's.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from procs import command_of, descendants  # benchmarks/, the script's folder


def role_of(argv):
    """What a process of a ttf job is, from its argv; None for a process that is not Python."""
    if not argv or "python" not in os.path.basename(argv[0]):
        return None
    if "--job" in argv and "--index" in argv:
        return f"{argv[argv.index('--job') + 1]} {argv[argv.index('--index') + 1]}"
    rest = argv[1:]  # the script (or -m module / -c) after the interpreter's own options
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
        rest = rest[1:]
    script = rest[1] if rest[:1] == ["-m"] and len(rest) > 1 else (rest[0] if rest else "")
    if script.endswith("models/train.py"):
        if "--prepare-data" in argv:
            return "prepare data"
        if "--sync" in argv and "--task-index" in argv:  # a synchronous job's worker
            return f"worker {argv[argv.index('--task-index') + 1]}"
        return "rank" if "--horovod" in argv else "chief"
    return f"python {os.path.basename(script)}"  # horovodrun, its helpers, the op build


def peak_rss_bytes(pid):
    """VmHWM of a live process, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--every", type=float, default=0.5, help="seconds between samples (default 0.5)")
    p.add_argument("--out", default=None, help="also write the JSON object to this file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command after --")
    job = subprocess.Popen(command, stdout=sys.stderr)
    seen = {}  # pid -> (role, peak bytes)
    while True:
        for pid in [job.pid, *descendants(job.pid)]:
            role, peak = role_of(command_of(pid)), peak_rss_bytes(pid)
            if role is not None and peak is not None:
                seen[pid] = (role, max(peak, seen.get(pid, ("", 0))[1]))
        if job.poll() is not None:
            break
        time.sleep(args.every)
    result = {"command": command, "exit_code": job.returncode,
              "processes": sorted(({"role": role, "pid": pid, "peak_rss_mib": round(peak / 2**20, 1)}
                                   for pid, (role, peak) in seen.items()), key=lambda r: (r["role"], r["pid"]))}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return job.returncode


if __name__ == "__main__":
    sys.exit(main())
