import os

# Two test sets, one Keras each (a process's tf.keras is one or the other): by default the
# tf_keras set (everything but tests/keras3, TF_USE_LEGACY_KERAS=1); with TTF_TEST_KERAS=3,
# tests/keras3 alone, on Keras 3 (TF_USE_LEGACY_KERAS unset). ./test.sh runs both.
KERAS3 = os.environ.get("TTF_TEST_KERAS") == "3"
if KERAS3:
    if os.environ.get("TF_USE_LEGACY_KERAS"):
        raise RuntimeError("TTF_TEST_KERAS=3 runs the Keras 3 tests: unset TF_USE_LEGACY_KERAS")
else:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # models/ as a package

import pytest

KERAS3_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keras3")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's loadgroup (./test.sh): a test file runs whole in one process (its
    module fixtures once), unless its tests name a group shared with other files
    (@pytest.mark.xdist_group: tests that share one resource, such as the container image)."""
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
        import importlib.metadata  # noqa: PLC0415

        pytest_version, xdist_version = (tuple(int(p) for p in importlib.metadata.version(n).split(".")[:2])
                                         for n in ("pytest", "pytest-xdist"))
        if pytest_version >= (9, 2) and xdist_version <= (3, 8):
            raise pytest.UsageError(f"pytest {pytest.__version__} ignores pytest-xdist's test groups "
                                    "(pytest-dev/pytest-xdist#1386): install requirements.txt's pins "
                                    "(./scripts/setup_env.sh), or run TTF_TEST_PROCESSES=0 ./test.sh")


def pytest_ignore_collect(collection_path, config):
    path = str(collection_path)
    inside = path == KERAS3_DIR or path.startswith(KERAS3_DIR + os.sep)
    if KERAS3:  # tests/keras3 and the folders above it only
        return None if inside or KERAS3_DIR.startswith(path + os.sep) else True
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
