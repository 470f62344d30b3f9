"""A table sharded over devices (the parameter-server layout) trains exactly like one table.

Runs in a subprocess because splitting the CPU into logical devices must happen before
TensorFlow initialises its runtime."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import numpy as np
    import ttf
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]

    def train(shard_devices):
        layer = ttf.DynamicEmbedding(4, initializer="normal", seed=2, combiner="mean", shard_devices=shard_devices)
        opt = ttf.optimizers.Adam(0.05)
        rng = np.random.default_rng(0)
        for _ in range(15):
            ids = tf.RaggedTensor.from_row_lengths(rng.integers(-50, 50, size=40), [10, 0, 20, 10])
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(layer(ids, training=True) - 1.0))
            opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
        keys = np.arange(-50, 50, dtype=np.int64)
        return layer, layer(keys, training=False).numpy()

    single, rows_single = train(None)
    sharded, rows_sharded = train(devices)
    assert len(sharded.tables) == 3 and all(int(t.size()) > 0 for t in sharded.tables)
    assert int(sharded.size()) == int(single.size())
    np.testing.assert_allclose(rows_sharded, rows_single, rtol=1e-6, atol=1e-7)
    print("SHARDED_OK", int(sharded.size()), [int(t.size()) for t in sharded.tables])
""")


def test_sharded_table_trains_like_a_single_table():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SHARDED_OK" in proc.stdout
