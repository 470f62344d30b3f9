"""The compressed rows' codec (ops/kernels/row_codec.h) against a NumPy reference: int8
row-wise and bf16 write-back with seeded stochastic rounding, and their dequantization.

The codec is compiled here into a small driver (tests/embedding/row_codec_check.cc) with the
op library's flags (-O3, baseline x86-64: no FMA), so its float32 arithmetic is the same
IEEE operation for operation as NumPy's: the encodings must match bit for bit.
"""
import os
import shutil
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        pytest.fail(f"the C++ compiler {cxx!r} was not found (the op build needs it too)")
    binary = str(tmp_path_factory.mktemp("codec") / "row_codec_check")
    subprocess.run([cxx, "-O3", "-fno-math-errno", "-std=c++17", "-I", os.path.join(ROOT, "ops", "kernels"),
                    os.path.join(ROOT, "tests", "embedding", "row_codec_check.cc"), "-o", binary], check=True)
    folder = tmp_path_factory.mktemp("rows")

    def run(mode, seed, keys, steps, rows):
        rows = np.ascontiguousarray(rows, np.float32)
        n, dim = rows.shape
        records = np.zeros(n, dtype=[("key", "<i8"), ("step", "<i8"), ("x", "<f4", (dim,))])
        records["key"], records["step"], records["x"] = keys, steps, rows
        src, dst = str(folder / "in"), str(folder / "out")
        records.tofile(src)
        subprocess.run([binary, mode, str(seed), str(dim), src, dst], check=True)
        raw = np.fromfile(dst, np.uint8)
        width = dim + 8 if mode == "int8" else 2 * dim
        encoded = raw[: n * width].reshape(n, width)
        decoded = raw[n * width:].view(np.float32).reshape(n, dim)
        return encoded, decoded

    return run


# ------------------------------------------------------------------ the NumPy reference

def mix64(x):
    """SplitMix64's finaliser (table_hash.h) on uint64 arrays (wrapping arithmetic)."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & MASK
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def draws(seed, keys, steps, dim):
    """uint32 [n, dim]: RoundingDraws(seed, key, step).Bits(j)."""
    keys = np.asarray(keys, np.int64).view(np.uint64)
    steps = np.asarray(steps, np.int64).view(np.uint64)
    base = mix64(mix64(np.full_like(keys, seed) ^ np.uint64(0x6A09E667F3BCC908)) ^ keys)
    base = base ^ mix64(steps ^ np.uint64(0xBB67AE8584CAA73B))
    return (mix64(base[:, None] + np.arange(dim, dtype=np.uint64)[None, :]) >> np.uint64(32)).astype(np.uint32)


def uniform(bits):
    return (bits >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def encode_int8(x, u):
    """(codes int8 [n, dim], scale, bias float32 [n]) as EncodeInt8 computes them, in float32."""
    lo, hi = x.min(axis=1), x.max(axis=1)
    finite = np.isfinite(x).all(axis=1)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        scale = np.where(finite, (hi - lo) / np.float32(255.0), np.float32(np.nan)).astype(np.float32)
        inverse = np.where(scale > 0, np.float32(1.0) / scale, np.float32(0.0)).astype(np.float32)
        steps = (x - lo[:, None]) * inverse[:, None] + u
    steps = np.where(steps >= 0, steps, np.float32(0.0))  # NaN -> 0, as the C++ clamp
    steps = np.where(steps <= 255, steps, np.float32(255.0))
    codes = (np.floor(steps).astype(np.int32) - 128).astype(np.int8)
    bias = (lo + np.float32(128.0) * scale).astype(np.float32)
    return codes, scale, bias


def unpack_int8(encoded, dim):
    codes = encoded[:, :dim].view(np.int8)
    scale_bias = np.ascontiguousarray(encoded[:, dim:]).view(np.float32)
    return codes, scale_bias[:, 0], scale_bias[:, 1]


def encode_bf16(x, bits):
    b = x.view(np.uint32).astype(np.uint64)
    special = (b & 0x7F800000) == 0x7F800000
    quiet = np.where((b & 0x007FFFFF) != 0, 0x40, 0).astype(np.uint64)
    rounded = (b + (bits.astype(np.uint64) & 0xFFFF)) >> 16
    return np.where(special, (b >> 16) | quiet, rounded).astype(np.uint16)


def random_rows(rng, n, dim):
    """Normal rows at scales from 1e-6 to 1e6, some constant, some with one outlier."""
    rows = rng.normal(size=(n, dim)) * 10.0 ** rng.integers(-6, 7, (n, 1))
    rows[::7] = rows[::7, :1]  # constant rows
    rows[3::11, 0] *= 1000.0  # an outlier stretches the row's span
    return rows.astype(np.float32)


# ------------------------------------------------------------------ tests

@pytest.mark.parametrize("dim", [1, 4, 32, 67])
def test_int8_encoding_matches_the_reference_bit_for_bit(codec, dim):
    rng = np.random.default_rng(dim)
    n = 500
    rows = random_rows(rng, n, dim)
    keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    steps = rng.integers(0, 10**6, n)
    encoded, decoded = codec("int8", 7, keys, steps, rows)
    codes, scale, bias = unpack_int8(encoded, dim)
    ref_codes, ref_scale, ref_bias = encode_int8(rows, uniform(draws(7, keys, steps, dim)))
    np.testing.assert_array_equal(codes, ref_codes)
    np.testing.assert_array_equal(scale.view(np.uint32), ref_scale.view(np.uint32))
    np.testing.assert_array_equal(bias.view(np.uint32), ref_bias.view(np.uint32))
    # Dequantization: q * scale + bias (the serving layout's formula), bit for bit.
    np.testing.assert_array_equal(decoded, codes.astype(np.float32) * scale[:, None] + bias[:, None])
    # Within one step of the row's span of each value (plus float32 rounding of the bias),
    # and a constant row is exact.
    span = np.abs(rows).max(axis=1, keepdims=True)
    assert (np.abs(decoded - rows) <= scale[:, None] * 1.0001 + span * 2e-7).all()
    constant = (rows == rows[:, :1]).all(axis=1)
    np.testing.assert_array_equal(decoded[constant], rows[constant])


def test_int8_rounding_is_unbiased_and_a_pure_function_of_seed_key_and_step(codec):
    rng = np.random.default_rng(1)
    dim, n = 32, 4096
    row = rng.normal(size=dim).astype(np.float32)
    rows = np.repeat(row[None], n, axis=0)
    keys, steps = np.full(n, 12345), np.arange(n)  # one key written back at 4,096 steps
    encoded, decoded = codec("int8", 3, keys, steps, rows)
    scale = unpack_int8(encoded, dim)[1][0]
    # Each write-back errs by less than a step with mean 0: the mean of 4,096 draws lies
    # within 5 standard errors (a step / sqrt(12 * 4096) each) of the value.
    error = decoded.mean(axis=0) - row
    assert np.abs(error).max() < 5 * scale / np.sqrt(12 * n), (np.abs(error).max(), scale)
    nearest = np.abs(np.round((row - row.min()) / scale) * scale + row.min() - row)  # round-to-nearest's error
    assert np.abs(decoded - row).mean() > nearest.mean()  # the draws do vary the codes
    again, _ = codec("int8", 3, keys, steps, rows)
    np.testing.assert_array_equal(again, encoded)  # same (seed, key, step): same bytes
    other_seed, _ = codec("int8", 4, keys, steps, rows)
    assert (other_seed != encoded).any()


def test_int8_rows_with_a_non_finite_value_read_back_as_nan(codec):
    rows = np.array([[1.0, np.nan, 2.0], [1.0, np.inf, 2.0], [-3e38, 0.0, 3e38], [1.0, 2.0, 3.0]], np.float32)
    encoded, decoded = codec("int8", 0, np.arange(4), np.ones(4, np.int64), rows)
    assert np.isnan(decoded[:3]).all() and np.isfinite(decoded[3]).all()


def test_bf16_encoding_matches_the_reference_and_is_unbiased(codec):
    rng = np.random.default_rng(2)
    dim, n = 16, 2000
    rows = random_rows(rng, n, dim)
    rows[0, :6] = [np.nan, np.inf, -np.inf, 3.3895e38, -0.0, 1e-45]
    keys, steps = rng.integers(0, 2**40, n), rng.integers(1, 1000, n)
    encoded, decoded = codec("bf16", 5, keys, steps, rows)
    half = np.ascontiguousarray(encoded).view(np.uint16)
    np.testing.assert_array_equal(half, encode_bf16(rows, draws(5, keys, steps, dim)))
    np.testing.assert_array_equal(decoded.view(np.uint32), half.astype(np.uint32) << 16)
    assert np.isnan(decoded[0, 0]) and decoded[0, 1] == np.inf and decoded[0, 2] == -np.inf
    finite = np.isfinite(decoded) & np.isfinite(rows)
    relative = np.abs(decoded[finite] - rows[finite]) / np.maximum(np.abs(rows[finite]), 1e-30)
    assert relative.max() <= 2.0**-7  # below one bf16 step (8 bits of mantissa)
    # Unbiased: one value written back at 4,096 steps averages to it within 5 standard errors.
    x = np.float32(0.1234567)
    _, many = codec("bf16", 5, np.zeros(4096), np.arange(4096), np.full((4096, 1), x, np.float32))
    step = np.float32(2.0**-10)  # bf16's step in [2^-4, 2^-3)
    assert abs(many.mean() - x) < 5 * step / np.sqrt(12 * 4096)


# ------------------------------------------------------------------ compressed optimizer states

@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    binary = str(tmp_path_factory.mktemp("updates") / "compressed_updates_check")
    subprocess.run([os.environ.get("CXX", "g++"), "-O3", "-fno-math-errno", "-std=c++17", "-I",
                    os.path.join(ROOT, "ops", "kernels"),
                    os.path.join(ROOT, "tests", "embedding", "compressed_updates_check.cc"), "-o", binary], check=True)
    folder = tmp_path_factory.mktemp("update_rows")

    def run(mode, rows, grads, lr, b1=0.0, b2=0.0, eps=1e-7):
        src, dst = str(folder / "in"), str(folder / "out")
        np.concatenate([np.ravel(rows), np.ravel(grads)]).astype(np.float32).tofile(src)
        steps, n, dim = grads.shape
        args = [binary, mode, str(dim), str(n), str(steps)] + [repr(float(np.float32(v))) for v in (lr, b1, b2, eps)]
        subprocess.run(args + [src, dst], check=True)
        return np.fromfile(dst, np.float32).reshape(rows.shape)

    return run


def f32(x):
    return np.float32(x)


def mean_square(g):
    """MeanSquare in float32: element j's square into partial sum j % 8, in order, then the
    sums pairwise ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)), then / dim."""
    s = np.zeros((g.shape[0], 8), np.float32)
    for j in range(g.shape[1]):
        s[:, j % 8] = (s[:, j % 8] + g[:, j] * g[:, j]).astype(np.float32)
    pair = (s[:, :4] + s[:, 4:]).astype(np.float32)
    total = ((pair[:, 0] + pair[:, 1]).astype(np.float32) + (pair[:, 2] + pair[:, 3]).astype(np.float32))
    return (total.astype(np.float32) / f32(g.shape[1])).astype(np.float32)


def state_floats(dim):
    """Floats of a row-wise moment (RowwiseMomentFloats): the leading dim - 1 elements', then the
    last element's own; one at dim 1."""
    return 2 if dim > 1 else 1


@pytest.mark.parametrize("dim", [33, 14, 1])  # 14: MeanSquare's partial sums past the last 8; 1: one moment
def test_rowwise_adagrad_matches_the_reference(updates, dim):
    """Row-wise Adagrad: one accumulator for the leading dim - 1 elements (their mean g^2), and
    the last element's own (its g^2), as element-wise Adagrad."""
    rng = np.random.default_rng(3)
    steps, n, lr, eps = 5, 64, f32(0.05), f32(1e-7)
    rows = np.concatenate([rng.normal(size=(n, dim)), np.full((n, state_floats(dim)), 0.1)], 1).astype(np.float32)
    grads = rng.normal(size=(steps, n, dim)).astype(np.float32)
    got = updates("adagrad", rows, grads, lr, eps=eps)
    ref, last, own = rows.copy(), dim - 1, dim + state_floats(dim) - 1
    for t in range(steps):
        g = grads[t]
        if last > 0:
            ref[:, dim] = (ref[:, dim] + mean_square(g[:, :last])).astype(np.float32)
            step = (lr / np.sqrt((ref[:, dim] + eps).astype(np.float32))).astype(np.float32)
            ref[:, :last] = (ref[:, :last] - (step[:, None] * g[:, :last]).astype(np.float32)).astype(np.float32)
        ref[:, own] = (ref[:, own] + (g[:, last] * g[:, last]).astype(np.float32)).astype(np.float32)
        step = (lr / np.sqrt((ref[:, own] + eps).astype(np.float32))).astype(np.float32)
        ref[:, last] = (ref[:, last] - (step * g[:, last]).astype(np.float32)).astype(np.float32)
    # float32 operation for operation; sqrt and the in-order sum are exact IEEE in both.
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dim", [33, 1])
def test_partial_rowwise_adam_matches_the_reference(updates, dim):
    """Partial row-wise Adam: m per element; v for the leading dim - 1 elements (their mean g^2)
    and the last element's own."""
    rng = np.random.default_rng(4)
    steps, n, k = 6, 64, state_floats(dim)
    lr, b1, b2, eps = f32(0.01), f32(0.9), f32(0.999), f32(1e-7)
    rows = np.concatenate([rng.normal(size=(n, dim)), np.zeros((n, dim + k))], 1).astype(np.float32)
    grads = rng.normal(size=(steps, n, dim)).astype(np.float32)
    got = updates("adam", rows, grads, lr, b1, b2, eps)
    ref, last = rows.astype(np.float64), dim - 1
    x, m, v = ref[:, :dim], ref[:, dim:2 * dim], ref[:, 2 * dim:]  # views into ref
    for t in range(1, steps + 1):
        g = grads[t - 1].astype(np.float64)
        alpha = float(lr) * np.sqrt(1 - float(b2) ** t) / (1 - float(b1) ** t)
        if last > 0:
            v[:, 0] += ((g[:, :last] ** 2).mean(1) - v[:, 0]) * (1 - float(b2))
        v[:, k - 1] += (g[:, last] ** 2 - v[:, k - 1]) * (1 - float(b2))
        m += (g - m) * (1 - float(b1))
        x[:, :last] -= m[:, :last] * (alpha / (np.sqrt(v[:, 0]) + float(eps)))[:, None]
        x[:, last] -= m[:, last] * (alpha / (np.sqrt(v[:, k - 1]) + float(eps)))
    # A float64 reference of the formulas: the float32 kernel within float32 rounding (pow's
    # bias correction is computed in float32 there).
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
