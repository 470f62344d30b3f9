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
