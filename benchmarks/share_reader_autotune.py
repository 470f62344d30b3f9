"""Reader.share_dataset with and without tf.data's autotune thread, interleaved (3 repetitions
of 300 batches of 1024 after 20 warm-up batches, one share of one).

    .venv/bin/python benchmarks/share_reader_autotune.py FILE
"""
import sys, time
import tensorflow as tf, ttf
path = sys.argv[1]
r = ttf.data.Reader([path], "criteo")
res = {True: [], False: []}
for rep in range(3):
    for autotune in (True, False):
        ds = r.share_dataset(1024, 0, 1, num_epochs=None)
        o = tf.data.Options(); o.autotune.enabled = autotune
        ds = ds.with_options(o)
        it = iter(ds)
        for _ in range(20): next(it)
        t = time.perf_counter(); c = time.process_time()
        for _ in range(300): next(it)
        res[autotune].append(300 * 1024 / (time.perf_counter() - t))
        del it
for k, v in res.items():
    print("autotune", k, "rows/s", sorted(int(x) for x in v))
