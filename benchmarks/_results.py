"""Where a benchmark records a result: benchmarks/results/<topic>.md, newest entry first.

The entry goes after the file's header (its text before the first "## " heading), so the
newest result is the first a reader sees. benchmarks/RESULTS.md indexes these files.
"""
import os

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def record(topic, entry):
    """Inserts `entry` (markdown starting with a "## " heading) into results/<topic>.md; returns the path."""
    path = os.path.join(RESULTS_DIR, f"{topic}.md")
    text = open(path).read() if os.path.exists(path) else f"# {topic}\n\nNewest first.\n"
    cut = text.find("\n## ")
    head, rest = (text, "") if cut < 0 else (text[:cut + 1], text[cut + 1:])
    body = entry.strip("\n") + "\n"
    with open(path, "w") as f:
        f.write(head.rstrip("\n") + "\n\n" + body + ("\n" + rest if rest else ""))
    return path


def machine(path="."):
    """One line on the machine a figure was measured on: cores, CPU model, its AVX flags, the free disk of `path`."""
    import platform
    import shutil

    flags, cpu = set(), platform.processor()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                flags.update(w for w in line.split(":", 1)[1].split() if w.startswith(("avx", "amx")))
            elif line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
    disk = shutil.disk_usage(path)
    return (f"{os.cpu_count()} cores, {cpu}, CPU flags {' '.join(sorted(flags)) or 'no avx'}; "
            f"disk {disk.free / 2**30:.0f} GiB free of {disk.total / 2**30:.0f} GiB")
