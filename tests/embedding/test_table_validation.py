"""Bad attributes, hyperparameters and imports get an InvalidArgument naming what was wrong
(never a crash, never rows silently turned NaN)."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import ttf  # noqa: F401  (sets up Keras 2 before TF is used)
from ttf._ops import ops

_names = itertools.count()


def new_table(dim=4, **attrs):
    return ops().ttf_embedding_table(dim=dim, shared_name=f"validation_{next(_names)}", **attrs)


@pytest.mark.parametrize("attrs,match", [
    (dict(dim=2**62), r"dim must be in \[1, 4096\], got 4611686018427387904"),
    (dict(dim=4097), r"dim must be in \[1, 4096\]"),
    (dict(dim=4, num_shards=5000), r"num_shards must be in \[1, 4096\], got 5000"),
    (dict(dim=4, max_candidates=2**40), r"max_candidates must be in \[1, 2147483648\]"),
    (dict(dim=4, initializer="constant", init_a=float("nan")), "init_a and init_b must be finite"),
    (dict(dim=4, default_value=float("inf")), "default_value must be finite, got inf"),
    (dict(dim=4, initializer="normal", init_b=0.0), r"needs a stddev \(init_b\) > 0"),
])
def test_table_creation_refuses_bad_attrs(attrs, match):
    dim = attrs.pop("dim")
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        new_table(dim, **attrs)


def test_dim_bound_is_what_a_lookup_needs():
    # The largest allowed dim works end to end (a 2**62 dim used to segfault at the first find).
    h = new_table(4096, initializer="zeros")
    rows = ops().ttf_table_find_or_insert(h, [1, 2], dim=4096)
    assert rows.shape == (2, 4096) and not rows.numpy().any()


@pytest.mark.parametrize("other", [
    dict(dim=8), dict(initializer="zeros"), dict(init_b=0.1), dict(seed=1), dict(default_value=1.0),
    dict(admission_min_count=2), dict(max_candidates=10), dict(num_shards=4),
])
def test_reopening_a_name_with_other_attrs_fails(other):
    name = f"reopen_{next(_names)}"
    base = dict(dim=4, initializer="uniform", init_a=-0.05, init_b=0.05, seed=0, default_value=0.0,
                admission_min_count=0, max_candidates=4194304, num_shards=16)
    ops().ttf_embedding_table(shared_name=name, **base)
    ops().ttf_embedding_table(shared_name=name, **base)  # the same attrs reopen it
    key = next(iter(other))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"a table named '{name}' already exists.*{key}="):
        ops().ttf_embedding_table(shared_name=name, **{**base, **other})


def _apply(name, h, keys, grads, *scalars, **attrs):
    return getattr(ops(), f"ttf_table_apply_{name}")(h, keys, grads, *scalars, **attrs)


GOOD = {"sgd": [0.1], "adagrad": [0.1, 1e-7], "adam": [0.1, 0.9, 0.999, 1e-7],
        "ftrl": [0.1, -0.5, 0.0, 0.0, 0.0, 0.0]}
ARG_NAMES = {"sgd": ["learning_rate"], "adagrad": ["learning_rate", "epsilon"],
             "adam": ["learning_rate", "beta_1", "beta_2", "epsilon"],
             "ftrl": ["learning_rate", "learning_rate_power", "l1", "l2", "l2_shrinkage", "beta"]}
BAD = [  # (optimizer, argument, bad value)
    *[(opt, "learning_rate", v) for opt in GOOD for v in (-0.1, float("nan"), float("inf"))],
    ("ftrl", "learning_rate", 0.0),
    ("adagrad", "epsilon", -1e-7), ("adagrad", "epsilon", float("nan")),
    ("adam", "beta_1", 1.0), ("adam", "beta_1", -0.1), ("adam", "beta_2", 1.5), ("adam", "beta_2", float("nan")),
    ("adam", "epsilon", -1.0), ("adam", "epsilon", 0.0), ("adam", "epsilon", float("inf")),
    ("ftrl", "learning_rate_power", 0.5), ("ftrl", "l1", -1.0), ("ftrl", "l2", -1.0),
    ("ftrl", "l2_shrinkage", -0.5), ("ftrl", "beta", float("nan")),
]


@pytest.mark.parametrize("opt,arg,value", BAD)
def test_apply_refuses_bad_hyperparameters_and_leaves_rows(opt, arg, value):
    h = new_table(4, initializer="constant", init_a=0.5)
    ops().ttf_table_find_or_insert(h, [1, 2], dim=4)
    scalars = list(GOOD[opt])
    scalars[ARG_NAMES[opt].index(arg)] = value
    shown = f"{value:g}"  # as C++ prints it: -1, 0, nan, inf
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{arg} must be finite and .*, got {shown}"):
        _apply(opt, h, [1, 2], np.ones((2, 4), np.float32), *scalars, 1)
    np.testing.assert_array_equal(ops().ttf_table_find(h, [1, 2], dim=4).numpy(), np.full((2, 4), 0.5))


@pytest.mark.parametrize("opt", sorted(GOOD))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_apply_refuses_non_finite_grads_and_leaves_rows(opt, bad):
    # The check is one vectorized pass over the gradient's bits; the error names the first bad
    # value, its row and its key. The largest finite float and a subnormal pass it.
    h = new_table(4, initializer="constant", init_a=0.5)
    keys = np.arange(10, 30, dtype=np.int64)
    ops().ttf_table_find_or_insert(h, keys, dim=4)
    grads = np.zeros((20, 4), np.float32)
    grads[3, 1] = np.finfo(np.float32).max
    grads[5, 0] = np.float32(1e-45)
    grads[13, 2] = bad
    grads[17, 3] = bad
    shown = f"{bad:g}"
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"grads holds a non-finite value \({shown}\) in row 13 \(key 23\); no row was updated"):
        _apply(opt, h, keys, grads, *GOOD[opt], 1)
    np.testing.assert_array_equal(ops().ttf_table_find(h, keys, dim=4).numpy(), np.full((20, 4), 0.5))
    grads[13, 2] = grads[17, 3] = 0.0
    assert int(_apply(opt, h, keys, grads, *GOOD[opt], 1)) == 20  # max float and a subnormal: finite


def test_zero_denominators_are_refused():
    h = new_table(4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="epsilon must be finite and > 0 when initial_acc"):
        _apply("adagrad", h, [1], np.zeros((1, 4), np.float32), 0.1, 0.0, 1, initial_accumulator_value=0.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="ftrl needs initial_accumulator_value > 0, l2 > 0"):
        _apply("ftrl", h, [1], np.zeros((1, 4), np.float32), 0.1, -0.5, 0.0, 0.0, 0.0, 0.0, 1,
               initial_accumulator_value=0.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="initial_accumulator_value must be finite"):
        _apply("adagrad", h, [1], np.zeros((1, 4), np.float32), 0.1, 1e-7, 1, initial_accumulator_value=float("nan"))


@pytest.mark.parametrize("opt", sorted(GOOD))
def test_boundary_hyperparameters_are_accepted(opt):
    # What tf_keras accepts stays accepted: lr 0 (SGD, Adagrad, Adam), beta_1 0, l1/l2 0.
    h = new_table(4, initializer="constant", init_a=0.5)
    ops().ttf_table_find_or_insert(h, [1], dim=4)
    scalars = list(GOOD[opt])
    if opt != "ftrl":
        scalars[0] = 0.0
    if opt == "adam":
        scalars[1] = 0.0
    assert int(_apply(opt, h, [1], np.ones((1, 4), np.float32), *scalars, 1)) == 1
    rows = ops().ttf_table_find(h, [1], dim=4).numpy()
    assert np.isfinite(rows).all()
    if opt != "ftrl":
        np.testing.assert_array_equal(rows, np.full((1, 4), 0.5))  # lr 0 moves nothing


def _import(h, keys=(1,), values=None, meta=None, cand=(), cand_meta=None, optimizer="", slot_init=(), step=1,
            **attrs):
    keys = np.asarray(keys, np.int64)
    dim_total = 4 * (1 + len(slot_init))
    values = np.ones((len(keys), dim_total), np.float32) if values is None else values
    meta = np.ones((len(keys), 2), np.int64) if meta is None else np.asarray(meta, np.int64)
    cand = np.asarray(cand, np.int64)
    cand_meta = np.ones((len(cand), 2), np.int64) if cand_meta is None else np.asarray(cand_meta, np.int64)
    return ops().ttf_table_import(h, keys, values, meta, cand, tf.reshape(cand_meta, [-1, 2]), optimizer,
                                  tf.constant(slot_init, tf.float32), step, **attrs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(meta=[[-1, 1]]), r"meta\[0\] has a negative count: -1"),
    (dict(meta=[[1, -5]]), r"meta\[0\] has a negative last-seen step: -5"),
    (dict(cand=[7], cand_meta=[[-2, 0]]), r"candidate_meta\[0\] has a negative count"),
    (dict(step=-1), "step must be >= 0, got -1"),
    (dict(optimizer="rmsprop"), "optimizer must be one of '', 'sgd', 'adagrad', 'adam', 'ftrl', got 'rmsprop'"),
    (dict(optimizer="adam", slot_init=(0.0,)), r"optimizer 'adam' keeps 2 slot\(s\) per row, but slot_init has 1"),
    (dict(optimizer="sgd", slot_init=(0.1,)), r"optimizer 'sgd' keeps 0 slot\(s\)"),
    (dict(optimizer="adagrad", slot_init=(float("nan"),)), "slot_init must be finite"),
    (dict(meta=np.ones((2, 2))), r"meta must have shape \[1, 2\]"),
    (dict(keys=[1, 2], values=np.ones((1, 4), np.float32)), r"values must have shape \[2, 4\]"),
    (dict(keys=[3, 3]), "keys holds key 3 more than once"),
    (dict(cand=[1]), "key 1 is in both keys and candidate_keys"),
    (dict(num_partitions=0), "num_partitions"),
    (dict(num_partitions=2, partition=2), r"partition must be in \[0, num_partitions = 2\), got 2"),
])
def test_import_refuses_bad_checkpoints_and_changes_nothing(kwargs, match):
    h = new_table(4, initializer="constant", init_a=0.5)
    ops().ttf_table_find_or_insert(h, [10, 11], dim=4)
    before = ops().ttf_table_export(h)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        _import(h, **kwargs)
    after = ops().ttf_table_export(h)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_grad_refuses_rows_wider_than_any_table():
    with pytest.raises(tf.errors.InvalidArgumentError, match="grads rows must have at most 4096"):
        ops().ttf_embedding_grad(tf.zeros([0, 2**40]), tf.zeros([0], tf.int32), [1, 2, 3])
