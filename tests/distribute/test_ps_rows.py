"""Compressed table rows (rows="int8" / "bf16", docs/table_rows.md) on real parameter servers
(ps_rows.py: 3 in-process TensorFlow servers and a chief): a table on 2 PS trains to the same
bytes as on the chief (the same kernels), its checkpoint (full + delta) restores into 3 PS and
into one process bit for bit (the source's table checksum), and its int8 serving shards, built
on each PS, hold the training codes, scale and bias byte for byte."""
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.distribute.test_ranks_rows import DIM, assert_same_rows, rank_rows, saved_checksum

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def test_compressed_rows_on_parameter_servers_train_restore_and_serve(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "distribute", "ps_rows.py"), str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-4000:]
    for rows in ("int8", "bf16"):
        on_ps = rank_rows(tmp_path, f"{rows}", "ps")
        with np.load(tmp_path / f"{rows}-ps.npz") as saved:
            assert [d.split("/device")[0] for d in saved["devices"]] == ["/job:ps/replica:0/task:0",
                                                                         "/job:ps/replica:0/task:1"]
        assert len(on_ps[0]["keys"]) > 400
        # The same kernels on a PS as on the chief: the same bytes, rows and slots.
        np.testing.assert_array_equal(on_ps[0]["values"].view(np.uint32),
                                      rank_rows(tmp_path, f"{rows}", "chief")[0]["values"].view(np.uint32))
        np.testing.assert_array_equal(on_ps[1], rank_rows(tmp_path, f"{rows}", "chief")[1])
        for target in ("three_ps", "one"):  # to the bit: the source's checksum
            assert_same_rows(rank_rows(tmp_path, f"{rows}", target), on_ps)
            assert saved_checksum(tmp_path, rows, target) == saved_checksum(tmp_path, rows, "ps")
        with np.load(tmp_path / f"{rows}-serving.npz") as served:
            assert all("/job:ps/" in d for d in served["devices"]), served["devices"]
            order = np.argsort(served["keys"])
            np.testing.assert_array_equal(served["keys"][order], on_ps[0]["keys"])
            if rows == "int8":  # the training rows as they are: no round trip through float32
                np.testing.assert_array_equal(served["packed"][order].view(np.uint8), on_ps[1][:, :DIM + 8])
