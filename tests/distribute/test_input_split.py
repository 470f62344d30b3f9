"""Split input on a real parameter-server job (start_all.sh: 1 ps + 2 workers + chief over
gRPC): one epoch trains each row once across the workers, and a chief killed mid-epoch
(kill -9) resumes from its checkpoint's input position: no row skipped, none trained twice
beyond the rows since that checkpoint."""
import json
import os
import signal

import pytest
import tensorflow as tf

from tests.distribute.test_cluster import child_pid, finish, start, wait_for

pytestmark = pytest.mark.slow
ROWS = 20_000  # synthetic rows; every 5th is held out for eval, so one epoch trains 16,000
TRAIN_ROWS = ROWS - ROWS // 5


def test_two_workers_one_epoch_train_each_row_once(tmp_path):
    metrics = tmp_path / "m.json"
    out = finish(start("--epochs", "1", "--synthetic-rows", str(ROWS), "--batch-size", "256",
                       "--metrics-out", str(metrics), "--", "--cache-dir", str(tmp_path / "cache")))
    assert "[train] done:" in out, out[-3000:]
    result = json.loads(metrics.read_text())
    assert result["cluster"] == {"ps": 1, "workers": 2}
    assert result["examples_trained"] == TRAIN_ROWS == result["examples_trained_this_run"]
    # Each worker's share ends in a partial batch: at most one more step per worker than N / B.
    assert TRAIN_ROWS // 256 <= result["steps"] <= TRAIN_ROWS // 256 + 2, result["steps"]


def test_chief_killed_mid_epoch_resumes_from_the_checkpointed_position(tmp_path):
    ckpt, metrics, cache = tmp_path / "ckpt", tmp_path / "m.json", str(tmp_path / "cache")
    args = ["--epochs", "1", "--synthetic-rows", str(ROWS), "--batch-size", "64", "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "20", "--metrics-out", str(metrics), "--", "--cache-dir", cache, "--log-every", "20"]
    proc = start(*args)
    out = wait_for(proc, "[train] step 6", timeout=600)  # past step 60: checkpoints at 20, 40, 60 written
    os.kill(child_pid(proc.pid, "models/train.py"), signal.SIGKILL)
    out += finish(proc)
    assert not metrics.exists(), out[-3000:]
    # The checkpoint a resume restores: the chain's (the kill may land inside the next save, after
    # TensorFlow's own `checkpoint` file names it but before ttf's chain does).
    chain = json.loads((ckpt / "ttf_chain.json").read_text())
    saved = tf.train.load_checkpoint(str(ckpt / chain["full"]))
    names = [n for n in saved.get_variable_to_shape_map() if n.startswith("input_position/counts/")]
    per_share = [int(saved.get_tensor(name)) for name in sorted(names)]
    at_checkpoint = sum(per_share)
    assert len(names) == 2, names
    assert min(per_share) > 0, per_share  # each worker reads its own share (not both share 0)
    assert 0 < at_checkpoint < TRAIN_ROWS

    out = finish(start(*args))
    assert "resumed from" in out and "[train] done:" in out, out[-3000:]
    result = json.loads(metrics.read_text())
    # Together: every training row exactly once (the rows run 1 trained after its last
    # checkpoint were lost with it and trained again by run 2).
    assert result["examples_trained"] == TRAIN_ROWS, (result, at_checkpoint)
    assert result["examples_trained_this_run"] == TRAIN_ROWS - at_checkpoint
