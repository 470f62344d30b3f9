"""The op fuzzer (tests/fuzz/fuzz_ops.py): no crash, no hang, and only the expected
non-InvalidArgument errors, on a fixed seed; the harness attributes a crash to its case."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fuzz_ops  # noqa: E402

# NotFound: an op on a table a racing thread destroyed. Aborted: an import changed the slot
# layout under a concurrent update (the update says so instead of writing misaligned rows).
EXPECTED_OTHER = ("NotFoundError", "AbortedError")


def check(summary, cases):
    assert summary["crash"] == 0 and summary["hang"] == 0, summary["failures"]
    assert summary["cases"] == cases, summary  # each case counted once
    unexpected = [k for k in summary["other_types"] if not k.startswith(EXPECTED_OTHER)]
    assert not unexpected, {k: summary["other_messages"].get(k) for k in unexpected}  # the first of each, with its case
    assert summary["racing"] >= cases // fuzz_ops.RACE_EVERY, summary
    assert summary["invalid"] > 0 and summary["ok"] > 0, summary  # the generator reaches both sides


def test_fuzz_fixed_seed_quick():
    check(fuzz_ops.run(48, seed=0, batch=48, log=lambda *_: None), 48)


@pytest.mark.slow
def test_fuzz_harness_attributes_a_crash_to_its_case(monkeypatch):
    """A crash in a batch is rerun case by case: case 2 aborts before it runs, case 3 after its
    record (on its way out). Each counts once, as a crash: counted also as finished, case 3 made
    `cases` 6 (the large run's rare bare AssertionError, when a slow case under load sent a
    batch to the reruns)."""
    monkeypatch.setenv("TTF_FUZZ_ABORT_AT", "2")
    monkeypatch.setenv("TTF_FUZZ_ABORT_AFTER", "3")
    summary = fuzz_ops.run(5, seed=0, batch=5, log=lambda *_: None)
    assert summary["cases"] == 5 and summary["crash"] == 2, summary
    assert [f["case"] for f in summary["failures"]] == [2, 3]


@pytest.mark.slow
def test_fuzz_fixed_seed_large():
    check(fuzz_ops.run(2000, seed=1, batch=250, log=lambda *_: None), 2000)
