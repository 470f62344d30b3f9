"""Synchronous training on TensorFlow's collectives equals one process on the global batch:
a user's own functional Keras model (sync_parity.py: ttf.FusedEmbedding over 26 fields, two
Dense layers, fp32, ttf Adam, 200 steps of 256 synthetic rows) on 2 workers each keeping its
slice of every global batch, on Keras 2 (tf_keras) and on Keras 3; and a killed worker
stops the other within 60 s with one line naming it."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.distribute.test_sync_collectives import ENV, ROOT, finish, run_workers

KERAS2 = dict(ENV, TF_USE_LEGACY_KERAS="1")
KERAS3 = {k: v for k, v in ENV.items() if k != "TF_USE_LEGACY_KERAS"}
SCRIPT = os.path.join(ROOT, "tests", "distribute", "sync_parity.py")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: one process on the global batch (started once, read by both tests)."""
    out = tmp_path_factory.mktemp("one") / "one.json"
    proc = subprocess.Popen([sys.executable, SCRIPT, str(out), "one", "0"], cwd=ROOT, env=KERAS2,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, out


def table(results):
    keys = np.concatenate([np.array(r["keys"], np.int64) for r in results])
    rows = np.concatenate([np.array(r["rows"], np.float32).reshape(-1, 8) for r in results])
    order = np.argsort(keys)
    return keys[order], rows[order]


@pytest.mark.slow
@pytest.mark.parametrize("keras", ["2", "3"])
def test_two_workers_equal_one_process_on_the_global_batch(one_process, keras, tmp_path):
    procs = run_workers("sync_parity.py", tmp_path / "sync", env=KERAS2 if keras == "2" else KERAS3)
    outputs = finish(procs)
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-4000:]
    reference, reference_out = one_process
    if reference.poll() is None or reference.returncode is None:
        finish([reference])
    assert reference.returncode == 0
    one = json.loads(reference_out.read_text())
    workers = [json.loads((tmp_path / f"sync.{rank}.json").read_text()) for rank in (0, 1)]
    assert [w["iterations"] for w in workers] == [200, 200] and one["iterations"] == 200
    # The same keys, each on the worker shard_of names (no key twice).
    one_keys, one_rows = table([one])
    keys, rows = table(workers)
    np.testing.assert_array_equal(keys, one_keys)
    # Rows: the same updates summed in another order (per worker, then over the workers) over
    # 200 Adam steps; measured max difference 6.5e-7 (Keras 2) and 4.1e-7 (Keras 3).
    np.testing.assert_allclose(rows, one_rows, rtol=0, atol=1e-5)
    assert abs(workers[0]["auc"] - one["auc"]) < 5e-4, (workers[0]["auc"], one["auc"])
    assert abs(workers[0]["logloss"] - one["logloss"]) < 5e-4, (workers[0]["logloss"], one["logloss"])
    assert one["auc"] > 0.7  # the model learned the planted signal: the comparison means something
    # Bytes: the padded alltoalls and count exchanges within 10% of the rows and ids they carry.
    assert workers[0]["payload_bytes"] <= workers[0]["wire_bytes"] <= 1.1 * workers[0]["payload_bytes"]


@pytest.mark.slow
def test_a_killed_worker_stops_the_other_naming_it(tmp_path):
    procs = run_workers("sync_parity.py", tmp_path / "kill", "200", "5", env=KERAS2)  # worker 1 exits at step 5
    survivor, killed = procs
    killed.wait(timeout=600)
    lost_at = time.monotonic()
    assert killed.returncode == 3
    output = finish([survivor], timeout=120)[0]
    stopped_after = time.monotonic() - lost_at
    assert survivor.returncode == 1, output[-4000:]
    assert stopped_after < 60, stopped_after
    lines = [line for line in output.splitlines() if line.startswith("ttf (worker 0): training stopped")]
    assert len(lines) == 1 and "lost worker 1 (127.0.0.1:" in lines[0], output[-4000:]
    assert json.loads((tmp_path / "kill.0.json").read_text())["lost"] == [1]
