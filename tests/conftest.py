import importlib.util
import os

# Two test sets, one Keras each (a process's tf.keras is one or the other): by default the
# tf_keras set (everything but tests/keras3, TF_USE_LEGACY_KERAS=1); with TTF_TEST_KERAS=3,
# tests/keras3 alone, on Keras 3 (TF_USE_LEGACY_KERAS unset). ./test.sh runs both.
# A TensorFlow with no tf-keras (2.22: Keras 3 only) has no tf_keras set: every run is the Keras 3
# one, which then also takes the files in ANY_KERAS (they test ops, tables, data, serving and Job
# without depending on which Keras runs), and the rest is skipped with one line saying why.
TF_KERAS = importlib.util.find_spec("tf_keras") is not None
KERAS3 = os.environ.get("TTF_TEST_KERAS") == "3" or not TF_KERAS
if KERAS3:
    if os.environ.get("TF_USE_LEGACY_KERAS"):
        raise RuntimeError("TTF_TEST_KERAS=3 runs the Keras 3 tests: unset TF_USE_LEGACY_KERAS" if TF_KERAS else
                           "tf_keras is not installed (TensorFlow 2.22 has none): unset TF_USE_LEGACY_KERAS")
else:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import glob
import importlib.metadata
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # models/ as a package

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
KERAS3_DIR = os.path.join(TESTS_DIR, "keras3")
# Files of the tf_keras set that pass on Keras 3 as they are (checked on TensorFlow 2.22.0rc0): where
# there is no tf_keras they run in the Keras 3 set. With tf_keras they stay in the tf_keras set.
ANY_KERAS = [os.path.join(TESTS_DIR, *name.split("/")) for name in (
    "test_build.py", "test_resource_names.py", "test_wheel.py",
    "embedding/test_table_ops.py", "embedding/test_table_checkpoint_ops.py", "embedding/test_table_eviction.py",
    "embedding/test_table_hot_path.py", "embedding/test_table_memory.py", "embedding/test_table_races.py",
    "embedding/test_table_validation.py", "embedding/test_admission_sketch.py", "embedding/test_event_ttl.py",
    "embedding/test_sharded.py",
    "serving/test_follow.py", "serving/test_online_job.py",
    "data/test_criteo.py", "data/test_schema.py", "data/test_synthetic.py", "data/test_shares.py",
    "precision/test_switch.py", "precision/test_policy.py",
    "distribute/test_job.py", "distribute/test_sync_collectives.py",
)]
NO_TF_KERAS = ("the tf_keras set is skipped (Keras 2 tests, {} files): tf_keras is not installed, and TensorFlow {} has "
               "none (tf-keras exists for 2.16 .. 2.21); tests/keras3 and the files in tests/conftest.py's ANY_KERAS "
               "run on Keras 3")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's loadgroup (./test.sh): a test file runs whole in one process (its
    module fixtures once), unless its tests name a group shared with other files
    (@pytest.mark.xdist_group: tests that share one resource, such as the container image)."""
    if not TF_KERAS:  # a tf_keras-set file named on the command line (collected despite ignore_collect)
        reason = "needs tf_keras, which is not installed (TensorFlow 2.22 has none)"
        for item in items:
            if not str(item.path).startswith(KERAS3_DIR + os.sep) and str(item.path) not in ANY_KERAS:
                item.add_marker(pytest.mark.skip(reason=reason))
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(os.path.relpath(str(item.path), os.path.dirname(KERAS3_DIR))))
    # The longest group first: the container tests (an image build, then real clusters: about 20
    # minutes on 2 cores) in one process while the other runs the rest, not after it.
    items.sort(key=lambda item: item.get_closest_marker("xdist_group").args[:1] != ("containers",))


def pytest_configure(config):
    """pytest 9.2 drops xdist 3.8's groups without a word (pytest-dev/pytest-xdist#1386): a file's
    tests would run in both processes at once, its module fixtures twice."""
    if getattr(config.option, "dist", "no") == "loadgroup" and not hasattr(config, "workerinput"):
        pytest_version, xdist_version = (tuple(int(p) for p in importlib.metadata.version(n).split(".")[:2])
                                         for n in ("pytest", "pytest-xdist"))
        if pytest_version >= (9, 2) and xdist_version <= (3, 8):
            raise pytest.UsageError(f"pytest {pytest.__version__} ignores pytest-xdist's test groups "
                                    "(pytest-dev/pytest-xdist#1386): install requirements.txt's pins "
                                    "(./scripts/setup_env.sh), or run TTF_TEST_PROCESSES=0 ./test.sh")


def _tf_keras_only_files():
    return [p for p in glob.glob(os.path.join(TESTS_DIR, "**", "test_*.py"), recursive=True)
            if not p.startswith(KERAS3_DIR + os.sep) and p not in ANY_KERAS]


def pytest_terminal_summary(terminalreporter):
    if not TF_KERAS:  # one line, even under -q: why most of the suite did not run here
        terminalreporter.write_line("SKIPPED " + NO_TF_KERAS.format(len(_tf_keras_only_files()),
                                                                     importlib.metadata.version("tensorflow")))


def pytest_sessionfinish(session, exitstatus):
    """Without tf_keras, a run of tf_keras-set files only collects nothing: skipped (the summary line
    says why), not failed."""
    if not TF_KERAS and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


def pytest_ignore_collect(collection_path, config):
    path = str(collection_path)
    if KERAS3:  # tests/keras3 (and without tf_keras, ANY_KERAS) and the folders above them only
        roots = [KERAS3_DIR] + ([] if TF_KERAS else ANY_KERAS)
        keep = any(path == root or path.startswith(root + os.sep) or root.startswith(path + os.sep) for root in roots)
        return None if keep else True
    inside = path == KERAS3_DIR or path.startswith(KERAS3_DIR + os.sep)
    return True if inside else None

# TTF_TEST_PROFILE=FILE appends one line per test: wall seconds, CPU seconds of pytest and of its
# (waited-for) child processes, the test id. Wall far above CPU marks a waiting-bound test.
PROFILE = os.environ.get("TTF_TEST_PROFILE")
if PROFILE:
    import resource
    import time

    def _cpu_seconds():
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start, (own, children) = time.monotonic(), _cpu_seconds()
        yield
        own_after, children_after = _cpu_seconds()
        with open(PROFILE, "a") as out:
            out.write(f"{time.monotonic() - start:.1f}\t{own_after - own:.1f}\t{children_after - children:.1f}\t{item.nodeid}\n")
