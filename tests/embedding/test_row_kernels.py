"""The vector row kernels (ops/kernels/row_kernels.cc: AVX2, chosen at run time) give the bits
of the scalar ones (row_codec.h, which tests/embedding/test_row_codec.py checks against NumPy).

A small driver (tests/embedding/row_kernels_check.cc) built with the op library's flags
(-O3, baseline x86-64) encodes and decodes rows of every width 1..67 with both: int8 and bf16,
stochastic and to-nearest, directly and through RowLayout with each optimizer's slots, on rows
made to part them (constant rows, zeros of both signs, NaN, infinities, spans past the float
range, denormals, outliers). Any differing byte fails.
"""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = os.path.join(ROOT, "ops", "kernels")


def has_avx2():
    with open("/proc/cpuinfo") as f:
        return " avx2" in f.read()


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        pytest.fail(f"the C++ compiler {cxx!r} was not found (the op build needs it too)")
    binary = str(tmp_path_factory.mktemp("kernels") / "row_kernels_check")
    sources = [os.path.join(ROOT, "tests", "embedding", "row_kernels_check.cc"),
               os.path.join(KERNELS, "row_kernels.cc"), os.path.join(KERNELS, "row_layout.cc")]
    subprocess.run([cxx, "-O3", "-fno-math-errno", "-std=c++17", "-I", KERNELS, *sources, "-o", binary], check=True)
    return binary


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads the CPU's flags from /proc/cpuinfo (Linux)")
def test_vector_kernels_give_the_scalar_kernels_bits(check):
    out = subprocess.run([check, "600"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    if not has_avx2():
        assert out.stdout.strip() == "no-avx2"
        pytest.skip("this CPU has no AVX2: only the scalar kernels run here")
    assert out.stdout.strip() == f"avx2 ok {600 * 67}", out.stdout
