"""Horovod misuse raises on every rank instead of hanging or keeping 1/N of a table (real
Horovod: horovodrun --gloo, 2 ranks; the ranks run tests/distribute/hvd_misuse.py)."""
import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "distribute", "hvd_misuse.py")
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
pytestmark = pytest.mark.slow


def run(mode, tmp_path, timeout=240):
    pytest.importorskip("horovod.tensorflow", reason="run ./scripts/setup_horovod.sh (./test.sh --all does)")
    prefix = str(tmp_path / mode)
    proc = subprocess.Popen([HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, SCRIPT, mode, prefix],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a rank hung (at exit, after the watchdog's shutdown): fail, never hang
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"horovodrun {mode} did not end within {timeout}s; output: {stdout[-3000:]}{stderr[-3000:]}")
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    for rank in (0, 1):  # both ranks ran to the end of the script and exited normally (no os._exit)
        assert f"[hvd_misuse] rank {rank} reached the end" in stdout, stdout[-3000:]
    return [json.loads(open(f"{prefix}-{rank}.json").read()) for rank in (0, 1)], prefix


def test_a_collective_on_one_rank_raises_on_every_rank_naming_the_fix(tmp_path):
    (rank0, rank1), _ = run("stall", tmp_path)
    assert rank0["call"]["error"] == rank1["call"]["error"] == "CollectiveMisuseError"
    assert "table_size waited 10s for the other ranks" in rank0["call"]["message"]
    assert "Call it on every rank" in rank0["call"]["message"]
    assert rank0["call"]["seconds"] < 60 and rank1["call"]["seconds"] < 60  # no hang
    assert "check_same_config failed" in rank1["call"]["message"]


def test_restore_then_broadcast_saved_model_and_serving_export(tmp_path):
    (rank0, rank1), prefix = run("misc", tmp_path)
    for result in (rank0, rank1):
        # tf.saved_model.save of a sharded table: refused, naming the fix, no Horovod op traced.
        assert result["saved_model"]["error"] == "ValueError"
        assert "export_for_serving(model, path, collectives) on every rank" in result["saved_model"]["message"]
        # manager.save alone would write this rank's ids: refused, naming the call that saves all.
        assert result["plain_save"]["error"] == "ValueError", result["plain_save"]
        assert ("ttf.distribute.sync.save_checkpoint(manager, step, collectives) on every rank"
                in result["plain_save"]["message"])
        # Restore on rank 0 only, then broadcast: an error on both ranks, not 1/N of the rows.
        assert result["idiom"]["error"] == "CollectiveMisuseError", result["idiom"]
        assert result["idiom"]["seconds"] < 60
        assert result["table_size"] == 60  # 10 examples x 3 fields per rank, distinct ids
    # tdh.export_for_serving: one version (rank 0 returns it), each rank's rows written by that
    # rank (no table gathered), and it predicts what the 2-rank model predicts, both ranks' ids.
    assert rank0["serving_version"] == f"{prefix}-serving/1" and rank1["serving_version"] is None
    assert os.listdir(f"{prefix}-serving") == ["1"]
    assert rank0["export_gathers"] == rank1["export_gathers"] == []
    assert rank0["served_max_diff"] <= 1e-6 < rank0["served_spread"]
    # A two-table model called eagerly after its export: the same predictions, served the same.
    assert rank0["two_tables_eager_diff"] == rank1["two_tables_eager_diff"] == 0.0
    assert rank0["two_tables_served_diff"] <= 1e-6
    assert not os.path.exists(f"{prefix}-saved-0") or not os.path.exists(os.path.join(f"{prefix}-saved-0", "saved_model.pb"))


KERAS3_MODEL = """
import tensorflow as tf, ttf, ttf.distribute.horovod as tdh
tdh.hvd.init()
coll = tdh.HorovodCollectives()  # the ranks' collectives, passed to every tdh call
ids = tf.keras.Input([2], dtype=tf.int64)
model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(ttf.FusedEmbedding(4, num_fields=2)(ids))))
try:
    tdh.shard_tables(model, coll)
except ValueError as err:
    print("refused:", err)
"""


def test_shard_tables_refuses_a_keras_3_model_naming_the_fix():
    """Keras 3 (TF_USE_LEGACY_KERAS unset): one line naming the setting, not an AttributeError
    from inside Keras 3's functional graph, and no layer left half sharded."""
    pytest.importorskip("horovod.tensorflow", reason="run ./scripts/setup_horovod.sh (./test.sh --all does)")
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    proc = subprocess.run([HOROVODRUN, "--gloo", "-np", "1", "-H", "localhost:1", sys.executable, "-c", KERAS3_MODEL],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "is a Keras 3 model" in proc.stdout and "Set TF_USE_LEGACY_KERAS=1" in proc.stdout, proc.stdout[-3000:]
