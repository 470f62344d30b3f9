"""by_key: a table export with its rows and candidates sorted by key, for the checkpoint tests
(test files and the scripts they run as subprocesses) to compare tables bit for bit."""
import numpy as np


def by_key(export):
    """dict of numpy arrays: `export` (a table export) with rows and candidates in key order."""
    out = {name: np.asarray(t) for name, t in export.items()}
    for keys, fields in (("keys", ("keys", "values", "meta")), ("candidate_keys", ("candidate_keys", "candidate_meta"))):
        order = np.argsort(out[keys])
        for name in fields:
            out[name] = out[name][order]
    return out
