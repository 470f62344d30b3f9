"""The online job as a user runs it: `python -m ttf.data.producer` renames hour files into a
folder, `start_all.sh --stream folder:... --publish-dir ...` trains on them and publishes while
a DeltaFollower follows, with event-time TTL evicting (published as deletes); SIGTERM
publishes, checkpoints and exits 0, and the follower then serves, bit for bit, the rows of the checkpoint taken at that moment (the trainer's table at
the follower's sequence number)."""
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import ttf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def checkpoint_rows(path, dim):
    """{key: row [dim]} of the DeepFM table ("model/sparse") in checkpoint `path`, every shard and piece."""
    reader = tf.train.load_checkpoint(path)
    prefix = "model/sparse/logical_table/ttf/src-"
    keys = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith(prefix) and n.endswith("/keys"))
    assert keys, "no table in the checkpoint"
    rows = {}
    for name in keys:
        values = reader.get_tensor(name[: -len("keys")] + "values")[:, :dim]
        rows.update(zip(reader.get_tensor(name).tolist(), values))
    return rows


def test_stream_job_publishes_and_the_follower_serves_the_checkpoint_rows(tmp_path):
    incoming, publish, ckpt = tmp_path / "in", tmp_path / "publish", tmp_path / "ckpt"
    incoming.mkdir()
    producer = subprocess.Popen([sys.executable, "-m", "ttf.data.producer", "--out-dir", str(incoming),
                                 "--rows-per-hour", "4000", "--files-per-hour", "4", "--interval", "1"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job = subprocess.Popen([os.path.join(ROOT, "start_all.sh"), "--tiacc", "--fm", "--single", "--batch-size", "64",
                            "--stream", f"folder:{incoming}", "--checkpoint-dir", str(ckpt),
                            "--publish-dir", str(publish), "--publish-every", "1", "--ttl-seconds", "2",
                            # TTL evicts at progress lines: several before the stop, whatever the machine's speed
                            "--", "--log-every", "10"],
                           cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        follower = ttf.serving.DeltaFollower(str(publish))
        deadline = time.time() + 300
        while time.time() < deadline and (follower.version is None or follower.sequence < 5):
            time.sleep(1)
            if os.path.isdir(publish):
                follower.sync()
        assert follower.version is not None and follower.sequence >= 5, "the follower saw fewer than 5 deltas"
    finally:
        producer.terminate()
        producer.wait(timeout=60)
        os.killpg(job.pid, signal.SIGTERM)
        out, _ = job.communicate(timeout=300)
    assert job.returncode == 0, out[-4000:]
    assert "[train] stopped by SIGTERM after step" in out and "exiting 0" in out, out[-3000:]
    assert "[train] published to" in out, out[-3000:]  # SIGTERM publishes before it checkpoints
    evicted = [int(m) for m in re.findall(r", (\d+) evicted by --ttl-seconds", out)]
    assert evicted and evicted[-1] > 0, out[-3000:]  # event-time TTL ran (files 1 s apart, TTL 2 s)
    follower.sync()
    assert follower.refused is None, follower.refused
    table = follower._info["tables"][0]  # pylint: disable=protected-access
    want = checkpoint_rows(tf.train.latest_checkpoint(str(ckpt)), table["dim"])
    keys = np.array(sorted(want), np.int64)
    served = follower.lookup(table["name"], keys).numpy()
    np.testing.assert_array_equal(served, np.stack([want[k] for k in keys.tolist()]))  # rows copied, never recomputed
