"""Synchronous training on real Horovod (horovodrun --gloo, 2 ranks on this host): ttf tables
sharded over the ranks equal one process on the global batch, a user's own model under
horovodrun (model.fit and a GradientTape loop), start_all.sh --hvd, compression, a killed
rank, mismatched flags, and --horovod without horovod installed."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.jobs import descendants

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "models", "train.py")
START = os.path.join(ROOT, "start_all.sh")
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def horovod():
    """Horovod must be installed where the slow tests run (./test.sh --all installs it)."""
    try:
        import horovod.tensorflow  # noqa: F401
    except ImportError as err:
        unsupported = os.path.join(sys.prefix, ".ttf-horovod-unsupported")  # written by setup_horovod.sh
        if os.path.exists(unsupported):
            pytest.skip(open(unsupported).read().strip())
        pytest.fail(f"horovod is not installed ({err}): run ./scripts/setup_horovod.sh (./test.sh --all does)")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """12,000 synthetic Criteo rows with a planted model (train) and 3,000 more (eval)."""
    out = tmp_path_factory.mktemp("data")
    paths = []
    for name, rows, seed in (("train.txt", 12000, 1), ("eval.txt", 3000, 2)):
        path = out / name
        subprocess.run([sys.executable, "-m", "ttf.data.synthetic", "--rows", str(rows), "--seed", str(seed),
                        "--out", str(path)], check=True, capture_output=True, cwd=ROOT, env=ENV)
        paths.append(str(path))
    return paths


def horovodrun(np_, *cmd, timeout=900):
    return subprocess.run([HOROVODRUN, "--gloo", "-np", str(np_), "-H", f"localhost:{np_}", *cmd], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=ENV)


def train(*args, ranks=None, timeout=900):
    cmd = [sys.executable, TRAIN, *args]
    if ranks is None:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)
    else:
        proc = horovodrun(ranks, *cmd, "--horovod", timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


COMMON = ["--tiacc", "--model", "fm", "--steps", "60", "--precision", "fp32", "--optimizer", "adam", "--seed", "3"]


@pytest.fixture(scope="module")
def two_ranks(horovod, synthetic, tmp_path_factory):
    """One 2-rank job the tests below share (each 2-rank job costs a minute or two): batch 128 a
    rank, split input, a save every 20 steps and every 3rd full (a full checkpoint at 20, deltas
    at 40 and 60), no compression, summaries in out_dir/tb. Returns (stdout, metrics, checkpoint
    directory)."""
    out_dir = tmp_path_factory.mktemp("two_ranks")
    out = train(*COMMON, "--data", synthetic[0], "--eval-data", synthetic[1], "--batch-size", "128",
                "--checkpoint-every", "20", "--full-every", "3", "--log-every", "20", "--logdir", str(out_dir / "tb"),
                "--metrics-out", str(out_dir / "two.json"), "--checkpoint-dir", str(out_dir / "two"), ranks=2)
    return out, json.loads((out_dir / "two.json").read_text()), out_dir / "two"


@pytest.mark.slow
def test_two_ranks_match_one_process_on_the_global_batch(two_ranks, synthetic, tmp_path):
    """2 ranks x batch 128 vs 1 process x batch 256 (same seed, data, fp32 Adam, 60 steps).
    Each rank reads its own half of the data (split input), so the batches differ from the one
    process's; 60 x 256 rows cover the 12,000 training rows in both runs: the same ids in the
    tables, AUC and logloss close; and the one process's checkpoint restores into 2 ranks bit
    for bit. (Exact equality on the global batch is tested on tdh.rank_slice below.)"""
    out, two, two_dir = two_ranks
    data = ["--data", synthetic[0], "--eval-data", synthetic[1]]
    train(*COMMON, *data, "--batch-size", "256", "--metrics-out", str(tmp_path / "one.json"),
          "--checkpoint-dir", str(tmp_path / "one"))
    assert "[train] done: 60 steps" in out and "(2 Horovod ranks)" in out, out[-3000:]
    assert out.count("[train] done:") == 1  # rank 0 reports, once
    one = json.loads((tmp_path / "one.json").read_text())
    assert two["cluster"] == {"horovod_ranks": 2, "compression": "none"} and two["ranks"] == 2
    assert two["eval_rows"] == one["eval_rows"] == 3000
    assert two["table_size"] == one["table_size"] > 1000
    assert abs(two["auc"] - one["auc"]) < 0.02 and abs(two["logloss"] - one["logloss"]) < 0.02, (one, two)
    assert one["auc"] > 0.6  # it learned something: the comparison means something
    assert two["wire_bytes_per_step"] > 0
    # The ranks' checkpoint chain holds every id of both ranks: the same ids as the one-process table.
    np.testing.assert_array_equal(checkpoint_keys(two_dir), checkpoint_keys(tmp_path / "one"))
    # (2 ranks -> one process, bit for bit: test_delta_checkpoints_of_two_ranks_restore_into_one_process.)
    # The one-process checkpoint restores into 2 ranks (each id to its owning rank), bit for bit.
    shutil.copytree(tmp_path / "one", tmp_path / "one_to_two")
    out = train(*COMMON, *data, "--batch-size", "128", "--metrics-out", str(tmp_path / "one_to_two.json"),
                "--checkpoint-dir", str(tmp_path / "one_to_two"), ranks=2)
    assert "at step 60" in out, out[-3000:]
    restored = json.loads((tmp_path / "one_to_two.json").read_text())
    assert restored["table_size"] == one["table_size"] and restored["table_checksum"] == one["table_checksum"]


@pytest.mark.slow
def test_train_logdir_horovod_rank_zero_writes(two_ranks):
    from tests.summary.test_summary import check_run  # pylint: disable=import-outside-toplevel

    _, metrics, checkpoint_dir = two_ranks
    logdir = checkpoint_dir.parent / "tb"
    check_run(logdir, metrics, 60)  # rows: both ranks' shards added up
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1  # rank 0 alone writes


def checkpoint_keys(directory):
    """The sorted ids of every table in the checkpoint chain of `directory` (its full checkpoint
    and deltas: nothing is evicted in these jobs, so their union is the table's ids)."""
    chain_file = os.path.join(directory, "ttf_chain.json")
    if os.path.exists(chain_file):
        chain = json.loads(open(chain_file).read())
        paths = [os.path.join(directory, name) for name in (chain["full"], *chain["deltas"])]
    else:
        paths = [tf.train.latest_checkpoint(str(directory))]
    keys = []
    for path in paths:
        reader = tf.train.load_checkpoint(path)
        names = [n for n in reader.get_variable_to_shape_map() if n.endswith("/keys")]
        assert names, sorted(reader.get_variable_to_shape_map())
        keys += [reader.get_tensor(n) for n in names]
    return np.unique(np.concatenate(keys))


@pytest.mark.slow
def test_delta_checkpoints_of_two_ranks_restore_into_one_process(two_ranks, synthetic, tmp_path):
    """2 ranks, a save every 20 steps, every 3rd full: the chain (full at 20, deltas at 40 and
    60) holds every rank's changed rows; restored into one process it is the 2-rank table at
    step 60, bit for bit."""
    _, two, two_dir = two_ranks
    chain = json.loads((two_dir / "ttf_chain.json").read_text())
    assert chain["full"].endswith("ckpt-20") and [p.rsplit("/", 1)[-1] for p in chain["deltas"]] == [
        "delta-40", "delta-60"], chain
    shutil.copytree(two_dir, tmp_path / "two")
    out = train(*COMMON, "--data", synthetic[0], "--eval-data", synthetic[1], "--batch-size", "128",
                "--checkpoint-every", "20", "--full-every", "3", "--metrics-out", str(tmp_path / "one.json"),
                "--checkpoint-dir", str(tmp_path / "two"))
    assert "at step 60" in out, out[-3000:]
    one = json.loads((tmp_path / "one.json").read_text())
    assert one["table_size"] == two["table_size"] > 1000 and one["table_checksum"] == two["table_checksum"]
    assert one["auc"] == pytest.approx(two["auc"], abs=1e-6)


@pytest.mark.slow
def test_own_keras_model_under_horovodrun_equals_one_process(horovod, tmp_path):
    """model.fit and a GradientTape loop, one model each, in the same horovodrun (a launch
    costs as much as the training here)."""
    script = os.path.join(ROOT, "tests", "distribute", "hvd_own_model.py")
    for ranks in (1, 2):
        proc = horovodrun(ranks, sys.executable, script, str(tmp_path / f"{ranks}.json"), "fit,tape", "32")
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ones, twos = (json.loads((tmp_path / f"{n}.json").read_text()) for n in (1, 2))
    for mode in ("fit", "tape"):
        one, two = ones[mode], twos[mode]
        assert two["size"] == 2 and one["iterations"] == two["iterations"] == 12, mode
        assert one["table_size"] == two["table_size"] > 100, mode
        np.testing.assert_allclose(two["predictions"], one["predictions"], rtol=1e-4, atol=1e-5, err_msg=mode)
    # The tape loop's graph: three tables, four calls, one exchange per direction (ids, rows, row gradients).
    assert sorted(n.rsplit("_", 1)[1] for n in twos["tape"]["alltoalls"]) == ["grads", "ids", "rows"], twos["tape"]


@pytest.mark.slow
def test_deepctr_model_accelerated_and_sharded_exchanges_all_tables_at_once(horovod, tmp_path):
    """DeepCTR's DeepFM through ttf.accelerate (a dim-8 and a dim-1 table), sharded over 2
    ranks: the carried-over rows move to their owners (same predictions, each id once), a
    step makes one alltoall per direction for both tables, and training equals one process."""
    pytest.importorskip("deepctr")
    script = os.path.join(ROOT, "tests", "distribute", "hvd_grouped.py")
    for ranks in (1, 2):
        proc = horovodrun(ranks, sys.executable, script, str(tmp_path / f"{ranks}.json"), timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in (1, 2))
    assert two["tables"] == [1, 8]
    np.testing.assert_allclose(two["after"], two["before"], rtol=1e-6, atol=1e-7)
    assert two["sharded_size"] == two["local_size"] == 6 * 300 * 2  # each carried-over id on one rank only
    assert sorted(n.rsplit("/", 1)[-1] for n in two["alltoalls"]) == [
        "ttf_2_tables_grads", "ttf_2_tables_ids", "ttf_2_tables_rows"], two["alltoalls"]
    np.testing.assert_allclose(two["trained"], one["trained"], rtol=1e-4, atol=1e-5)
    assert not np.allclose(two["trained"], two["after"], atol=1e-3)  # it trained
    assert one["table_size"] == two["table_size"]
    [warning] = two["warnings"]
    assert "user_table, item_table" in warning and "functional" in warning


@pytest.mark.slow
def test_a_non_finite_gradient_on_one_rank_skips_the_step_on_every_rank(horovod, tmp_path):
    script = os.path.join(ROOT, "tests", "distribute", "hvd_one_rank_nan.py")
    proc = horovodrun(2, sys.executable, script, str(tmp_path / "out"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"out-{rank}.json").read_text())
        assert result == {"skipped": [False, False, True, False, False], "skipped_steps": 1,
                          "optimizer_iterations": 4}, (rank, result)


@pytest.mark.slow
def test_compression_runs_and_sends_fewer_bytes(two_ranks, synthetic, tmp_path):
    """bf16 against the shared uncompressed job. fp16 is bf16's cast without the bit-cast bf16
    needs on Horovod's wire (ttf/distribute/collectives/_wire.py): bf16 runs the longer path; another 2-rank
    job would add a minute or two for the same check."""
    _, none, _ = two_ranks
    train(*COMMON, "--data", synthetic[0], "--eval-data", synthetic[1], "--batch-size", "128",
          "--hvd-compression", "bf16", "--metrics-out", str(tmp_path / "bf16.json"), ranks=2)
    bf16 = json.loads((tmp_path / "bf16.json").read_text())
    assert bf16["cluster"]["compression"] == "bf16"
    ratio = bf16["wire_bytes_per_step"] / none["wire_bytes_per_step"]
    assert 0.45 < ratio < 0.65, ratio  # ids stay 8 bytes; rows, grads and dense halve
    assert abs(bf16["auc"] - none["auc"]) < 0.02


@pytest.mark.slow
def test_start_all_hvd_passes_flags_through(horovod, tmp_path):
    metrics = tmp_path / "m.json"
    proc = subprocess.run([START, "--hvd", "--tiacc", "--fm", "--steps", "20", "--batch-size", "64",
                           "--metrics-out", str(metrics)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "horovodrun --gloo" in proc.stdout and "[train] done: 20 steps" in proc.stdout
    result = json.loads(metrics.read_text())
    assert result["cluster"]["horovod_ranks"] == 2 and result["batch_size"] == 64 and result["table_size"] > 0


@pytest.mark.slow
def test_a_killed_rank_stops_the_job_naming_it(horovod, tmp_path):
    proc = subprocess.Popen([START, "--hvd", "--tiacc", "--fm", "--steps", "100000", "--batch-size", "64",
                             "--", "--log-every", "10"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        lines, deadline = [], time.time() + 300
        while time.time() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "[train] step" in line or not line:
                break
        assert "[train] step" in lines[-1], "".join(lines)[-4000:]
        ranks = descendants(proc.pid)
        rank1 = [p for p in ranks if open(f"/proc/{p}/cmdline").read().split("\0")[0].endswith("python")
                 and "\0HOROVOD_RANK=1\0" in "\0" + open(f"/proc/{p}/environ").read()]
        assert len(rank1) == 1, ranks
        killed_at = time.time()
        os.kill(int(rank1[0]), signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
        assert time.time() - killed_at < 60
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1, out[-4000:]
    assert "Horovod rank 1 stopped (killed by signal 9)" in out, out[-4000:]


@pytest.mark.slow
def test_mismatched_flags_across_ranks_are_refused(horovod, tmp_path):
    rank_dependent = (f'if [ "$HOROVOD_RANK" = 1 ]; then b=32; else b=64; fi; exec {sys.executable} {TRAIN} '
                      '--horovod --tiacc --steps 5 --batch-size $b')
    proc = horovodrun(2, "sh", "-c", rank_dependent, timeout=600)
    assert proc.returncode != 0
    assert "different train.py flags: rank 1 differs from rank 0 in batch_size (32 vs 64)" in proc.stdout + proc.stderr


def test_horovod_flag_without_horovod_installed_is_a_clear_error():
    code = ("import sys, runpy; sys.modules['horovod'] = None; sys.argv = ['train.py', '--horovod', '--tiacc']; "
            f"runpy.run_path({TRAIN!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 1
    assert "--horovod needs horovod" in proc.stderr and "./scripts/setup_horovod.sh" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_import_ttf_does_not_import_horovod():
    code = "import sys, ttf, ttf.distribute; print('horovod' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, check=True).stdout
    assert out.strip() == "False"
