"""TtfReadRecords' CRC32C by the SSE4.2 instruction (ops/kernels/crc32c_sse42.h, chosen at run
time) gives TensorFlow's crc32c::Value bits: a driver (tests/data/crc32c_check.cc, built with
TensorFlow's compile and link flags) compares both on random buffers of every length 0..2,100
at every start offset 0..7; and records of random bytes and lengths written by
tf.io.TFRecordWriter (TensorFlow's CRCs) are read back by the op, every CRC checked, with the
records whose data was damaged afterwards found and counted."""
import os
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from ttf._ops import ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def has_sse42():
    with open("/proc/cpuinfo") as f:
        return " sse4_2" in f.read()


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads the CPU's flags from /proc/cpuinfo (Linux)")
def test_sse42_crc32c_gives_tensorflows_bits(tmp_path):
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        pytest.fail(f"the C++ compiler {cxx!r} was not found (the op build needs it too)")
    binary = str(tmp_path / "crc32c_check")
    tf_lib = tf.sysconfig.get_lib()
    subprocess.run([cxx, "-O2", "-w", os.path.join(ROOT, "tests", "data", "crc32c_check.cc"), "-I",
                    os.path.join(ROOT, "ops", "kernels"), *tf.sysconfig.get_compile_flags(), "-o", binary,
                    *tf.sysconfig.get_link_flags(), f"-Wl,-rpath,{tf_lib}"], check=True)
    out = subprocess.run([binary], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    if not has_sse42():
        assert out.stdout.strip() == "no-sse4.2"
        pytest.skip("this CPU has no SSE4.2: TensorFlow's CRC32C runs here")
    assert out.stdout.strip() == f"sse4.2 ok {(2101 + 6) * 8}", out.stdout


def test_records_of_random_bytes_written_by_tensorflow_are_read_and_damaged_ones_counted(tmp_path):
    rng = np.random.default_rng(48)
    lengths = list(range(0, 300)) + [int(n) for n in rng.integers(300, 5000, 40)] + [65537]
    records = [rng.integers(0, 256, n, np.uint8).tobytes() for n in lengths]
    path = str(tmp_path / "random.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for r in records:
            writer.write(r)
    out = ops().ttf_read_records(path, 0, 0, len(records) + 1)  # strict: any CRC that differs fails here
    data = out[0].numpy()
    assert [data[b:e] for b, e in zip(out[1].numpy().tolist(), out[2].numpy().tolist())] == records
    assert bool(out[7]) and int(out[6]) == 0

    damaged = bytearray(open(path, "rb").read())
    hit = sorted(int(i) for i in rng.choice(np.nonzero(lengths)[0], 25, replace=False))
    offsets = np.cumsum([0] + [16 + n for n in lengths])
    for i in hit:  # one bit of one data byte of each hit record
        damaged[offsets[i] + 12 + int(rng.integers(lengths[i]))] ^= 1 << int(rng.integers(8))
    with open(path, "wb") as f:
        f.write(bytes(damaged))
    out = ops().ttf_read_records(path, 0, 0, len(records) + 1, strict=False)
    assert int(out[6]) == len(hit)
    assert out[3].numpy().tolist() == [i for i in range(len(records)) if i not in hit]
