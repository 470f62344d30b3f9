"""One line for a TensorFlow error, for progress output and job logs."""


def error_summary(error):
    """One line for an OpError: its first line, plus the cause TensorFlow puts after
    "Graph execution error:" (the last line that is not a node trace), at most 400 chars."""
    lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    causes = [line for line in lines[1:] if not line.startswith(("Detected at node", "File ", "[[", "Stack trace"))
              and "Graph execution error" not in line]
    summary = lines[0] + (f" ... {causes[-1]}" if causes and causes[-1] != lines[0] else "")
    return f"{type(error).__name__}: {summary}"[:400]
