"""Every TFCollectives method on real workers (run by test_sync_collectives.py):

    python tests/distribute/sync_collectives.py OUT.json WORKER_HOSTS TASK_INDEX

Each worker builds its inputs from (rank, step) alone, so every worker can compute what
every other one sent: the results are checked here against NumPy, eagerly and inside a
tf.function whose shapes change every call, and written to OUT.json for the test.
"""
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import ttf.distribute.sync as tds
from ttf.distribute import Cluster, TFCollectives

out_path, hosts, task = sys.argv[1], sys.argv[2], int(sys.argv[3])
coll = TFCollectives(Cluster(worker_hosts=hosts, task_type="worker", task_index=task), timeout_seconds=60)
rank, size = coll.rank, coll.size


def splits_of(sender, step):
    """Rows `sender` sends each worker at `step`: uneven, some zero; at step 4 worker 0 sends none, at step 5
    nobody sends any."""
    if step == 5 or (step == 4 and sender == 0):
        return np.zeros(size, np.int32)
    return np.array([(sender * 3 + dest * 5 + step * 7) % 6 for dest in range(size)], np.int32)


def rows_of(sender, step):
    splits = splits_of(sender, step)
    rows = np.arange(splits.sum() * 3, dtype=np.float32).reshape(-1, 3) + 1000 * sender + 100 * step
    return rows, splits


def expected_alltoall(step):
    parts = []
    for sender in range(size):
        rows, splits = rows_of(sender, step)
        start = splits[:rank].sum()
        parts.append(rows[start:start + splits[rank]])
    return np.concatenate(parts), np.array([splits_of(s, step)[rank] for s in range(size)])


@tf.function
def traced_alltoall(rows, splits, ids):
    received, received_splits = coll.alltoall(rows, splits, count=True)
    id_rows, _ = coll.alltoall(ids, splits)
    return received, received_splits, id_rows, coll.allgather(ids), coll.allreduce(tf.reduce_sum(rows), "sum")


checks = {}
for step in range(6):
    rows, splits = rows_of(rank, step)
    want, want_splits = expected_alltoall(step)
    got, got_splits = coll.alltoall(tf.constant(rows), tf.constant(splits))
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(got_splits.numpy(), want_splits)
    ids = tf.constant(np.arange(splits.sum(), dtype=np.int64) + (1 << 40) * rank)
    got, got_splits, id_rows, gathered, total = traced_alltoall(tf.constant(rows), tf.constant(splits), ids)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(got_splits.numpy(), want_splits)
    np.testing.assert_array_equal(
        gathered.numpy(), np.concatenate([np.arange(splits_of(s, step).sum()) + (1 << 40) * s for s in range(size)]))
    np.testing.assert_allclose(total.numpy(), sum(rows_of(s, step)[0].sum() for s in range(size)), rtol=1e-6)
checks["alltoall"] = checks["allgather"] = True

for dtype in (tf.float16, tf.bfloat16, tf.int16):  # 16-bit wire types, the ones the ops do not take bit-cast
    block = tf.cast(tf.reshape(tf.range(size * 4) + 10 * rank, [size * 4, 1]), dtype)
    got = coll.alltoall_even(block).numpy().astype(np.float32).ravel()
    want = np.concatenate([np.arange(rank * 4, rank * 4 + 4) + 10 * s for s in range(size)])
    np.testing.assert_array_equal(got, want)
    got = coll.allgather(tf.cast([rank + 0.5], dtype) if dtype != tf.int16 else tf.constant([rank], tf.int16))
    assert got.dtype == dtype and got.shape == [size], (dtype, got)
checks["sixteen_bit"] = True

for op, want in (("sum", size * (size - 1) / 2), ("mean", (size - 1) / 2), ("min", 0), ("max", size - 1)):
    got = float(coll.allreduce(tf.constant([float(rank)]), op).numpy()[0])
    assert got == want, (op, got, want)
checks["allreduce"] = True

# mean_over_examples: batches of 2 and 3 examples; the global mean on both workers, and the
# gradient of this worker's term (size / examples on every worker = 2/5 per example).
values = tf.Variable(tf.range(rank + 2, dtype=tf.float32))
with tf.GradientTape() as tape:
    mean = tds.mean_over_examples(values, coll)
np.testing.assert_allclose(float(mean), (1 + 3) / 5, rtol=1e-6)
np.testing.assert_allclose(tape.gradient(mean, values).numpy(), [2 / 5] * (rank + 2), rtol=1e-6)
assert bool(tds.all_workers(tf.constant(True), coll)) and not bool(tds.all_workers(tf.constant(rank == 0), coll))
checks["mean_over_examples"] = True

variable = tf.Variable([rank + 1.0, -rank])
coll.broadcast_variables([variable], root=1)
np.testing.assert_array_equal(variable.numpy(), [2.0, -1.0])
assert bool(coll.broadcast(tf.constant(rank == 0), root=0).numpy())
checks["broadcast"] = True

objects = coll.allgather_object({"rank": rank, "text": "x" * (rank * 7 + 1)})
assert objects == [{"rank": r, "text": "x" * (r * 7 + 1)} for r in range(size)], objects
assert coll.broadcast_object({"decided_by": rank} if rank == 0 else None) == {"decided_by": 0}
checks["objects"] = True

checks["wire_bytes"], checks["payload_bytes"] = coll.wire_bytes(), coll.payload_bytes()
checks["rank"], checks["size"] = rank, size


def threads():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


# Traced collectives start no thread of their own: TensorFlow runs one sleeping thread per op with a
# timeout, and a job of a few steps a second piled up thousands until pthread_create failed.
before = threads()
for step in range(200):
    rows, splits = rows_of(rank, step % 4)
    traced_alltoall(tf.constant(rows), tf.constant(splits), tf.constant(np.arange(splits.sum(), dtype=np.int64)))
checks["threads_before"], checks["threads_after"] = before, threads()

# A worker alive but not joining a traced collective: the watchdog fails it after timeout_seconds.
coll.timeout_seconds = 6
started = time.monotonic()
if rank == 0:
    try:
        traced_alltoall(tf.constant(rows), tf.constant(splits), tf.constant(np.arange(splits.sum(), dtype=np.int64)))
        checks["stuck"] = "returned"
    except tf.errors.OpError as err:
        checks["stuck"] = f"{type(err).__name__}: {str(err)[:3000]}"
    checks["stuck_seconds"] = time.monotonic() - started
else:
    time.sleep(25)  # alive (heartbeats go on) and never joining
with open(out_path, "w") as f:
    json.dump(checks, f)
sys.stdout.flush()
os._exit(0)  # an aborted collective executor can hold the coordination service's shutdown barrier
