"""Keras 3's `model.export(path)` of a model with ttf tables writes a SavedModel that only a
process importing ttf can load (issue 46 item 7): it warns, in one line naming
ttf.export_for_serving, at export; ttf.export_for_serving itself warns nothing."""
import os
import subprocess
import sys

import pytest

# A fresh process with Python's default warning filters, as a user's script runs.
EXPORT = r"""
import numpy as np, keras, tensorflow as tf, ttf
ids = keras.Input([2], dtype="int64", name="ids")
out = keras.layers.Dense(1)(keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=2)(ids)))
model = keras.Model(ids, out)
model(np.array([[1, 2]]))
print("EXPORT", flush=True)
model.export("exported", verbose=False)
print("FOR_SERVING", flush=True)
ttf.export_for_serving(model, "serving")
print("DONE", flush=True)
"""

# Stock TensorFlow, no ttf: what the warning says about the model.export() SavedModel.
LOAD = r"""
import sys, tensorflow as tf
try:
    tf.saved_model.load("exported")
    print("LOADED")
except Exception as error:
    print("REFUSED", "TtfTable" in str(error))
tf.saved_model.load("serving/1")
assert not any(name.startswith("ttf") for name in sys.modules)
print("SERVING LOADED")
"""


def run_fresh(code, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONWARNINGS")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # fresh TensorFlow processes
def test_model_export_warns_in_one_line_naming_export_for_serving(tmp_path):
    proc = run_fresh(EXPORT, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["EXPORT", "FOR_SERVING", "DONE"]
    warned = [line for line in proc.stderr.splitlines() if "ttf.export_for_serving(model, base)" in line]
    assert len(warned) == 1, proc.stderr[-3000:]
    assert "UserWarning: ttf: this SavedModel holds ttf tables" in warned[0] and "TF Serving" in warned[0]
    loaded = run_fresh(LOAD, tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split() == ["REFUSED", "True", "SERVING", "LOADED"]
