"""A handful of benchmarks/faults.py's cases as slow tests: a kill -9 inside a save, a full
disk (a real tmpfs where this machine allows mounting one), an I/O error in the middle of a
save. Each checks, format-agnostically, that a fresh process restores the last complete
checkpoint with every key (the journal's key count and checksum), or that the job stopped
on one clear line. And, quick, how the sweep tells where a cluster kill landed."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_faults():
    spec = importlib.util.spec_from_file_location("faults", os.path.join(ROOT, "benchmarks", "faults.py"))
    faults = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(faults)
    return faults


def sweep(capsys, *flags):
    code = load_faults().main(["--cases", "1", "--steps", "20", "--save-every", "5", "--keys-per-step", "2000",
                        "--timeout", "300", *flags])
    return code, capsys.readouterr().out


@pytest.mark.slow
def test_kill_inside_a_save_leaves_the_last_complete_checkpoint(capsys):
    code, out = sweep(capsys, "--kinds", "kill-save", "--kill-window", "0.05")
    assert code == 0 and "kill-save #1: ok" in out and "identical" in out, out


@pytest.mark.slow
def test_a_full_disk_stops_on_one_line_and_keeps_the_last_checkpoint(capsys):
    code, out = sweep(capsys, "--kinds", "full-disk", "--tmpfs-kb", "1024")
    assert code == 0 and "full-disk #1: ok: stopped on one line" in out and "identical" in out, out


@pytest.mark.slow
def test_an_io_error_mid_save_loses_no_key_at_the_next_save(capsys):
    # --seed 0: the second save (a delta, --full-every 3) fails with EFBIG after 4096 bytes.
    code, out = sweep(capsys, "--kinds", "io-error", "--seed", "0")
    assert code == 0 and "io-error #1: ok" in out, out


def test_a_cluster_kill_lands_where_the_job_s_checkpoint_lines_say():
    # A job that prints nothing: the lines and the times they arrived are set by hand.
    job = subprocess.Popen([sys.executable, "-c", ""], stdout=subprocess.PIPE, text=True)
    output = load_faults()._Output(job)
    output.finish(60)
    output.lines = [(1.0, "[train] step 50: loss 0.6931\n"),
                    (2.0, "[train] checkpoint at step 50: saving (full)\n"),
                    (3.0, "[train] checkpoint at step 50: saved in 1.00 s\n"),
                    (4.0, "[1,0]<stdout>:[train] checkpoint at step 100: saving (delta)\n")]  # horovodrun's prefix
    assert output.landed(0.5) == "training (before any save)"
    assert output.landed(2.5) == "inside the full save of step 50"
    assert output.landed(3.5) == "training (after the save of step 50)"
    assert output.landed(4.5) == "inside the delta save of step 100"
