"""The DRAM + SSD tier: a tiered table with a tiny DRAM budget trains exactly (bit for bit)
as an all-DRAM one, checkpoints cross tiers both ways, a full disk fails cleanly, and bad
arguments are refused. The reference is the same table without a tier: its rows, slots and
counts are what the tier must reproduce (tolerance 0: every float compared by its bits)."""
import ctypes
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import ttf
from tests.embedding.test_table_races import run_concurrently
from tests.embedding.test_table_rows import import_stored, save_stored
from ttf._ops import ops
from ttf.embedding import EmbeddingTable, parse_size, tier_row_bytes

DIM = 4


def sorted_export(table):
    """(keys, values, meta) of table.export(), ordered by key."""
    ex = table.export()
    order = np.argsort(ex["keys"].numpy())
    return ex["keys"].numpy()[order], ex["values"].numpy()[order], ex["meta"].numpy()[order]


def assert_same_content(a, b):
    ka, va, ma = sorted_export(a)
    kb, vb, mb = sorted_export(b)
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_array_equal(va.view(np.uint32), vb.view(np.uint32))  # bit for bit
    np.testing.assert_array_equal(ma, mb)


def train_step(table, keys, step, optimizer="adam"):
    """Lookup, a gradient that depends on the rows read (so a wrong disk read changes the
    update), then the optimizer's apply; returns the rows read."""
    keys = np.asarray(keys, np.int64)
    rows = ops().ttf_table_find(table.resource_handle, keys, dim=table.dim, training=True)
    grads = rows * 0.5 - 0.01 * tf.cast(tf.reshape(keys % 7, [-1, 1]), tf.float32)
    if optimizer == "adam":
        ops().ttf_table_apply_adam(table.resource_handle, keys, grads, 0.01, 0.9, 0.999, 1e-7, step)
    else:
        ops().ttf_table_apply_adagrad(table.resource_handle, keys, grads, 0.05, 1e-7, step)
    return rows.numpy()


def zipf_batches(seed, steps, batch=64, vocab=3000):
    rng = np.random.default_rng(seed)
    return [np.minimum(rng.zipf(1.1, batch), vocab).astype(np.int64) * 7919 + 3 for _ in range(steps)]


# batch 1024: a shard's lookup reads hundreds of disk rows together; batch 8192 over 50,000 ids:
# over 2,048 distinct keys a call, so the lookup and the apply run their shards in two blocks
# on two threads (kMinKeysPerBlockTiered). Compressed rows (docs/table_rows.md) go to disk as
# stored (int8 Adam's row: 7 words at this dim, fp32's 12), so the same budget keeps more of them
# in DRAM, still far fewer than the table's.
@pytest.mark.parametrize("optimizer,admission,batch,vocab,rows", [
    ("adam", 0, 64, 3000, "fp32"), ("adagrad", 2, 64, 3000, "fp32"), ("adam", 0, 1024, 3000, "fp32"),
    ("adam", 0, 8192, 50000, "fp32"), ("adam", 0, 1024, 3000, "int8"), ("adagrad", 2, 64, 3000, "int8"),
    ("adam", 0, 64, 3000, "bf16")])
def test_tiered_table_trains_bit_for_bit_like_an_untiered_one(tmp_path, optimizer, admission, batch, vocab, rows):
    budget = 40 * tier_row_bytes(DIM, 2) * 2  # ~40 DRAM rows per shard: most rows live on disk
    tiered = EmbeddingTable(DIM, "normal", seed=3, num_shards=2, admission_min_count=admission,
                            dram_budget=budget, ssd_dir=str(tmp_path), rows=rows)
    plain = EmbeddingTable(DIM, "normal", seed=3, num_shards=2, admission_min_count=admission, rows=rows)
    # Rows made before any optimizer step (no slots yet): the first apply widens disk records too.
    seed_keys = np.arange(300, dtype=np.int64) * 31
    ops().ttf_table_find_or_insert(tiered.resource_handle, seed_keys, dim=DIM)
    ops().ttf_table_find_or_insert(plain.resource_handle, seed_keys, dim=DIM)
    for step, keys in enumerate(zipf_batches(1, 60, batch=batch, vocab=vocab), start=1):
        np.testing.assert_array_equal(train_step(tiered, keys, step, optimizer),
                                      train_step(plain, keys, step, optimizer), err_msg=f"step {step}")
    assert_same_content(tiered, plain)
    # The summary reads the disk tier's stored rows in the full layout too: one checksum.
    assert [int(t) for t in ops().ttf_table_summary(tiered.resource_handle)[:2]] == \
        [int(t) for t in ops().ttf_table_summary(plain.resource_handle)[:2]]
    stats = tiered.tier_stats()
    assert stats["disk_rows"] > stats["dram_rows"] > 0, stats
    assert stats["promoted"] > 0 and stats["disk_hits"] > 0, stats
    assert stats["dram_rows"] <= stats["dram_row_limit"] + batch, stats  # the budget plus one batch
    assert stats["dram_rows"] + stats["disk_rows"] == int(tiered.size()) == int(plain.size())
    # Inference reads disk rows too, and unseen keys get the default row.
    probe = np.concatenate([sorted_export(plain)[0][:50], [-5]])
    np.testing.assert_array_equal(
        ops().ttf_table_find(tiered.resource_handle, probe, dim=DIM, training=False).numpy(),
        ops().ttf_table_find(plain.resource_handle, probe, dim=DIM, training=False).numpy())


def test_compaction_keeps_every_row(tmp_path):
    """Rows cycling through the tier leave stale records behind; once they outnumber the live
    ones the file is rewritten (compacted) and every row still reads back bit for bit."""
    tiered = EmbeddingTable(2, num_shards=1, dram_budget=200 * tier_row_bytes(2, 2), ssd_dir=str(tmp_path))
    plain = EmbeddingTable(2, num_shards=1)
    keys = np.arange(3000, dtype=np.int64) * 13
    for step in range(1, 13):  # every key demoted and promoted again each round
        for batch in np.array_split(np.roll(keys, 7 * step), 20):
            train_step(tiered, batch, step)
            train_step(plain, batch, step)
    assert_same_content(tiered, plain)
    stats = tiered.tier_stats()
    record_bytes = 24 + 4 * 2 * 3
    assert stats["demoted"] * record_bytes > 2 * stats["disk_file_bytes"], stats  # compacted
    assert stats["disk_file_bytes"] >= stats["disk_rows"] * record_bytes, stats


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_evict_policy_orders_the_demotion(tmp_path, policy):
    """Thirty keys updated ten times long ago, then 150 keys updated once each, ten an update:
    DRAM (~60 rows) cannot hold both. lfu keeps the frequent keys in DRAM (the once-updated ones go to disk);
    lru demotes them, the least recently updated. Read from DRAM or disk: the tier's counters."""
    tiered = EmbeddingTable(DIM, num_shards=1, evict_policy=policy, dram_budget=90 * tier_row_bytes(DIM, 2),
                            ssd_dir=str(tmp_path))
    plain = EmbeddingTable(DIM, num_shards=1)
    frequent = np.arange(30, dtype=np.int64) * 11 + 5
    step = 0
    for step in range(1, 11):
        train_step(tiered, frequent, step)
        train_step(plain, frequent, step)
    for batch in np.array_split(np.arange(1000, 1150, dtype=np.int64), 15):
        step += 1
        train_step(tiered, batch, step)
        train_step(plain, batch, step)
    assert_same_content(tiered, plain)  # the order changes where rows live, never their content
    before = tiered.tier_stats()
    ops().ttf_table_find(tiered.resource_handle, frequent, dim=DIM, training=False)
    after = tiered.tier_stats()
    from_dram = after["dram_hits"] - before["dram_hits"]
    assert from_dram + after["disk_hits"] - before["disk_hits"] == len(frequent)
    assert from_dram == (len(frequent) if policy == "lfu" else 0), (policy, before, after)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_a_disk_row_returns_to_dram_only_above_the_last_row_demoted(tmp_path, policy):
    """DRAM admission: 600 keys updated once, then 30 keys twenty times, so most of the 600 are
    on disk. An update of one of them (ranked, by its history, below the last row demoted) is
    applied and written straight back: it stays on disk. Its next update finds it ranked above
    (just updated, its count grown): it comes back to DRAM. Rows read bit for bit as the
    untiered table's throughout."""
    tiered = EmbeddingTable(DIM, num_shards=1, evict_policy=policy, dram_budget=200 * tier_row_bytes(DIM, 2),
                            ssd_dir=str(tmp_path))
    plain = EmbeddingTable(DIM, num_shards=1, evict_policy=policy)
    once = np.arange(600, dtype=np.int64) * 7 + 1
    often = np.arange(30, dtype=np.int64) * 11 + 5000
    batches = np.array_split(once, 30) + [often] * 20
    for step, keys in enumerate(batches, start=1):
        train_step(tiered, keys, step)
        train_step(plain, keys, step)

    def tier_of(key):
        before = tiered.tier_stats()["dram_hits"]
        ops().ttf_table_find(tiered.resource_handle, np.array([key], np.int64), dim=DIM, training=False)
        return "dram" if tiered.tier_stats()["dram_hits"] > before else "disk"

    stats = tiered.tier_stats()
    assert stats["disk_rows"] > 400 and stats["written_back"] == 0, stats
    assert [tier_of(k) for k in often] == ["dram"] * len(often)
    key = once[0]
    assert tier_of(key) == "disk"
    for step, (where, written_back) in enumerate([("disk", 1), ("dram", 1)], start=len(batches) + 1):
        np.testing.assert_array_equal(train_step(tiered, [key], step), train_step(plain, [key], step))
        stats = tiered.tier_stats()
        assert (tier_of(key), stats["written_back"]) == (where, written_back), stats
    assert stats["dram_rows"] + stats["disk_rows"] == int(plain.size())
    assert_same_content(tiered, plain)


def test_remove_and_evict_reach_disk_rows(tmp_path):
    tiered = EmbeddingTable(DIM, num_shards=1, dram_budget=10 * tier_row_bytes(DIM, 2), ssd_dir=str(tmp_path))
    plain = EmbeddingTable(DIM, num_shards=1)
    for step, keys in enumerate(zipf_batches(2, 20, batch=16, vocab=200), start=1):
        train_step(tiered, keys, step)
        train_step(plain, keys, step)
    assert tiered.tier_stats()["disk_rows"] > 0
    doomed = sorted_export(plain)[0][::3]
    assert int(ops().ttf_table_remove(tiered.resource_handle, doomed)) == len(doomed)
    ops().ttf_table_remove(plain.resource_handle, doomed)
    assert int(tiered.evict(10, 2)) == int(plain.evict(10, 2)) > 0
    assert_same_content(tiered, plain)


def test_keys_sharing_a_disk_index_fingerprint_stay_apart(tmp_path):
    """The disk index files a key under 32 bits of its hash, and the key in the record decides.
    9833 and 291643 share that fingerprint (found by a search over 400,000 keys), so each one's
    index probe meets the other's record: with one on disk and the other absent, or both on
    disk, each must read, train, promote and be removed as itself."""
    a, b = 9833, 291643
    tiered = EmbeddingTable(DIM, "normal", seed=5, num_shards=1, dram_budget=8 * tier_row_bytes(DIM, 2),
                            ssd_dir=str(tmp_path))
    plain = EmbeddingTable(DIM, "normal", seed=5, num_shards=1)
    fillers = np.arange(1000, 1040, dtype=np.int64)  # recent rows that push a and b to disk
    batches = [[a], fillers[:20], [b], [5, 6], fillers[20:], [b, 7], [a], fillers[:20], [a, b], fillers[20:]]
    # An update keeps its own rows in DRAM and demotes every other row when they exceed the
    # budget: steps 2, 5 and 8 send a and b to disk. Disk reads expected: step 3 none (a on
    # disk, b absent: a's record must not be taken for b's), 6: b, 7: a, 9: both.
    disk_reads = {3: 0, 6: 1, 7: 1, 9: 2}
    for step, keys in enumerate(batches, start=1):
        before = tiered.tier_stats()["disk_hits"]
        np.testing.assert_array_equal(train_step(tiered, keys, step), train_step(plain, keys, step),
                                      err_msg=f"step {step}")
        if step in disk_reads:
            assert tiered.tier_stats()["disk_hits"] - before == disk_reads[step], (step, tiered.tier_stats())
        assert_same_content(tiered, plain)
    np.testing.assert_array_equal(  # inference reads, both on disk
        ops().ttf_table_find(tiered.resource_handle, [a, b], dim=DIM, training=False).numpy(),
        ops().ttf_table_find(plain.resource_handle, [a, b], dim=DIM, training=False).numpy())
    assert int(ops().ttf_table_remove(tiered.resource_handle, [a])) == 1
    assert int(ops().ttf_table_remove(tiered.resource_handle, [a])) == 0  # gone; b's record is not a's
    ops().ttf_table_remove(plain.resource_handle, [a])
    assert_same_content(tiered, plain)


def test_the_disk_index_counts_inside_the_budget(tmp_path):
    """RAM = DRAM rows + the disk tier's key index: the rows get what the index leaves, so the
    two together stay within the budget (plus one update's new rows) as the disk side grows."""
    budget, row_bytes = 1 << 20, tier_row_bytes(DIM, 2)
    table = EmbeddingTable(DIM, num_shards=1, dram_budget=budget, ssd_dir=str(tmp_path))
    keys = np.arange(30000, dtype=np.int64) * 11  # ~3x the budget: the index (~12 B a key) takes about a third
    limits = []
    for step, batch in enumerate(np.array_split(keys, 30), start=1):
        train_step(table, batch, step)
        stats = table.tier_stats()
        assert stats["dram_row_limit"] == (budget - stats["disk_index_bytes"]) // row_bytes, stats
        assert stats["dram_rows"] * row_bytes + stats["disk_index_bytes"] <= budget + len(batch) * row_bytes, stats
        limits.append(stats["dram_row_limit"])
    assert stats["disk_index_bytes"] > 0 and limits[-1] < budget // row_bytes  # the index took its share
    assert stats["dram_rows"] + stats["disk_rows"] == len(keys)


def test_an_unreadable_disk_tier_fails_evict_instead_of_keeping_rows(tmp_path):
    """Fault injection on the real file: the tier's (unlinked) file is truncated through
    /proc/self/fd, so its records cannot be read; an evict must raise, not keep them."""
    table = EmbeddingTable(DIM, num_shards=1, dram_budget=10 * tier_row_bytes(DIM, 2), ssd_dir=str(tmp_path))
    for step, keys in enumerate(zipf_batches(2, 20, batch=16, vocab=200), start=1):
        train_step(table, keys, step)
    assert table.tier_stats()["disk_rows"] > 0
    fds = descriptors_naming(str(tmp_path))
    assert fds, "the tier's file was not found among this process's files"
    for fd in fds:
        os.ftruncate(fd, 0)
    with pytest.raises(tf.errors.InternalError, match=f"ssd_dir '{tmp_path}' failed .*reading rows"):
        table.evict(10, 2)
    # A removal reads a disk key's record to confirm its key (the index holds fingerprints only).
    with pytest.raises(tf.errors.InternalError, match=f"ssd_dir '{tmp_path}' failed .*reading rows"):
        ops().ttf_table_remove(table.resource_handle, np.unique(zipf_batches(2, 20, batch=16, vocab=200)[0]))


def filesystem_of(path):
    """The type of the file system holding path (the longest mount point above it)."""
    path, best = os.path.realpath(path), ("", "")
    with open("/proc/self/mounts") as f:
        for line in f:
            point, kind = line.split()[1:3]
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best[0]):
                best = (point, kind)
    return best[1]


def descriptors_naming(text):
    """This process's descriptors whose /proc/self/fd link contains text (a tier file under
    tmp_path, unlinked; "io_uring" for a ring)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if text in os.readlink(f"/proc/self/fd/{fd}"):
                found.append(int(fd))
        except OSError:  # closed meanwhile (listdir's own descriptor)
            pass
    return found


def io_uring_allowed():
    """Whether this process may create an io_uring (io_uring_setup, system call 425 on every
    architecture; seccomp in a container or kernel.io_uring_disabled may refuse it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    fd = libc.syscall(425, 4, params)
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_disk_reads_that_miss_the_page_cache_read_the_same_rows(tmp_path):
    """The tier file's pages are dropped from the page cache (fsync, then POSIX_FADV_DONTNEED
    through /proc/self/fd), so the lookups' disk reads wait for the device (through io_uring
    where the kernel allows it, else on the disk read threads): rows, training and inference
    reads equal an untiered table's."""
    budget = 40 * tier_row_bytes(DIM, 2) * 2
    tiered = EmbeddingTable(DIM, "normal", seed=3, num_shards=2, dram_budget=budget, ssd_dir=str(tmp_path))
    plain = EmbeddingTable(DIM, "normal", seed=3, num_shards=2)
    batches = zipf_batches(7, 40, batch=1024, vocab=20000)
    for step, keys in enumerate(batches[:20], start=1):
        train_step(tiered, keys, step)
        train_step(plain, keys, step)
    fds = descriptors_naming(str(tmp_path))
    assert fds, "the tier's file was not found among this process's files"
    for step, keys in enumerate(batches[20:], start=21):
        for fd in fds:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        np.testing.assert_array_equal(train_step(tiered, keys, step), train_step(plain, keys, step))
    for fd in fds:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    probe = sorted_export(plain)[0]
    np.testing.assert_array_equal(
        ops().ttf_table_find(tiered.resource_handle, probe, dim=DIM, training=False).numpy(),
        ops().ttf_table_find(plain.resource_handle, probe, dim=DIM, training=False).numpy())
    assert_same_content(tiered, plain)
    stats = tiered.tier_stats()
    if filesystem_of(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is in memory ({filesystem_of(tmp_path)}): no read waits for a device")
    assert stats["disk_waits"] > 100, stats  # the waiting path ran
    if os.environ.get("TTF_SSD_IO_URING") == "0":
        assert len(descriptors_naming("io_uring")) == 0, "TTF_SSD_IO_URING=0 still made an io_uring"
    elif io_uring_allowed():
        assert len(descriptors_naming("io_uring")) > 0, "the kernel allows io_uring but the tier's reads did not use one"


def test_disk_reads_on_threads_when_io_uring_is_off():
    """TTF_SSD_IO_URING=0 (and a kernel or container without io_uring) reads on the thread
    pool: the test above, in a process with it set."""
    test = f"{__file__}::test_disk_reads_that_miss_the_page_cache_read_the_same_rows"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                          env={**os.environ, "TTF_SSD_IO_URING": "0"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# int8 is not here: an export of int8 rows is float32, and a restore re-quantizes it (scale and bias
# within float32 ulps, docs/table_rows.md), so it is not the same bits.
@pytest.mark.parametrize("rows", ["fp32", "bf16"])
def test_checkpoints_cross_tiers_both_ways(tmp_path, rows):
    budget = 30 * tier_row_bytes(DIM, 2) * 4
    tiered = EmbeddingTable(DIM, num_shards=4, dram_budget=budget, ssd_dir=str(tmp_path), rows=rows)
    for step, keys in enumerate(zipf_batches(3, 30), start=1):
        train_step(tiered, keys, step)
    assert tiered.tier_stats()["disk_rows"] > 0
    plain = EmbeddingTable(DIM, num_shards=3, rows=rows)
    plain.restore(tiered.export())
    assert_same_content(plain, tiered)
    back = EmbeddingTable(DIM, num_shards=4, dram_budget=budget, ssd_dir=str(tmp_path), rows=rows)
    back.restore(plain.export())
    assert_same_content(back, plain)
    stats = back.tier_stats()
    assert stats["disk_rows"] > 0 and stats["dram_rows"] <= stats["dram_row_limit"], stats
    # A delta (rows since step 20, upserted with merge) lands in the right tier too.
    for step, keys in enumerate(zipf_batches(4, 10), start=31):
        train_step(tiered, keys, step)
        train_step(plain, keys, step)
    back.restore(tiered.export(since_step=30))
    assert_same_content(back, tiered)
    # The restored tiered table keeps training like the untiered one.
    for step, keys in enumerate(zipf_batches(5, 10), start=41):
        np.testing.assert_array_equal(train_step(back, keys, step), train_step(plain, keys, step))
    assert_same_content(back, plain)



@pytest.mark.parametrize("rows", ["int8", "bf16"])
def test_a_checkpoint_of_compressed_tiered_rows_restores_to_the_bit_in_either_tier(tmp_path, rows):
    """A checkpoint (TtfTableSave) of a compressed table holds its stored words, DRAM's and the
    disk tier's alike; they restore to the same checksum into a table without a tier and into
    another tiered one (whose import demotes rows back to disk)."""
    budget = 30 * tier_row_bytes(DIM, 2) * 4
    tiered = EmbeddingTable(DIM, num_shards=4, dram_budget=budget, ssd_dir=str(tmp_path), rows=rows)
    for step, keys in enumerate(zipf_batches(3, 30), start=1):
        train_step(tiered, keys, step)
    assert tiered.tier_stats()["disk_rows"] > 0
    saved, tag = save_stored(tiered.resource_handle, tmp_path / "ckpt")
    assert tag.startswith(f"rows={rows} dim={DIM} optimizer=adam"), tag
    summary = lambda t: [int(x) for x in ops().ttf_table_summary(t.resource_handle)[:2]]  # noqa: E731
    plain = EmbeddingTable(DIM, num_shards=3, rows=rows)
    import_stored(plain.resource_handle, saved, tag)
    back = EmbeddingTable(DIM, num_shards=4, dram_budget=budget, ssd_dir=str(tmp_path), rows=rows)
    import_stored(back.resource_handle, saved, tag)
    assert summary(plain) == summary(back) == summary(tiered)
    assert back.tier_stats()["disk_rows"] > 0

def test_the_disk_file_is_unlinked_at_creation(tmp_path):
    table = EmbeddingTable(DIM, num_shards=2, dram_budget=tier_row_bytes(DIM, 2) * 4, ssd_dir=str(tmp_path))
    for step, keys in enumerate(zipf_batches(6, 5), start=1):
        train_step(table, keys, step)
    assert table.tier_stats()["disk_file_bytes"] > 0
    assert os.listdir(tmp_path) == []  # a killed process leaves nothing behind


def test_inference_lookups_during_promotion_and_demotion_read_every_row(tmp_path):
    """Inference lookups (DRAM probed per id, then the misses per shard from disk: two lock
    spans) while updates promote and demote rows between the tiers: a key that moves between
    the two still reads its row, never the default (-1.0). Zero gradients keep every row at
    1.0, so any stale, torn or lost read shows."""
    table = EmbeddingTable(DIM, "ones", num_shards=4, default_value=-1.0,
                           dram_budget=300 * tier_row_bytes(DIM, 1), ssd_dir=str(tmp_path))
    h = table.resource_handle
    keys = np.arange(5000, dtype=np.int64) * 13
    zeros = np.zeros((500, DIM), np.float32)
    for step, at in enumerate(range(0, 5000, 500), start=1):
        ops().ttf_table_apply_adagrad(h, keys[at:at + 500], zeros, 0.1, 1e-7, step, initial_accumulator_value=0.25)
    assert table.tier_stats()["disk_rows"] > 4000

    def update(rng, step):
        ops().ttf_table_apply_adagrad(h, rng.choice(keys, 500, replace=False), zeros, 0.1, 1e-7, step,
                                      initial_accumulator_value=0.25)

    def infer(rng, step):
        rows = ops().ttf_table_find(h, rng.choice(keys, 6000), dim=DIM, training=False).numpy()
        assert (rows == 1.0).all(), f"{int((rows == -1.0).all(1).sum())} rows read the default"

    errors = run_concurrently((update, update, infer, infer), seconds=3, first_step=100)
    assert not errors, errors[:3]
    stats = table.tier_stats()
    assert stats["promoted"] > 1000 and stats["demoted"] > 1000, stats


def test_bad_tier_arguments(tmp_path):
    with pytest.raises(ValueError, match="dram_budget .* and ssd_dir .* go together"):
        EmbeddingTable(DIM, dram_budget=1 << 20)
    with pytest.raises(ValueError, match="go together"):
        EmbeddingTable(DIM, ssd_dir=str(tmp_path))
    with pytest.raises(ValueError, match="dram_budget must be bytes >= 0, an int or a size"):
        EmbeddingTable(DIM, dram_budget=-1, ssd_dir=str(tmp_path))
    with pytest.raises(ValueError, match="dram_budget 'lots': size must be a number"):
        EmbeddingTable(DIM, dram_budget="lots", ssd_dir=str(tmp_path))
    # A size with a unit, as capacity takes: bytes, kept as an int in the layer's config.
    layer = ttf.DynamicEmbedding(DIM, dram_budget="1M", ssd_dir=str(tmp_path))
    assert layer.tables[0].dram_budget == 1 << 20 and layer.get_config()["dram_budget"] == 1 << 20
    with pytest.raises(tf.errors.InvalidArgumentError, match="ssd_dir '.*missing' cannot be written"):
        EmbeddingTable(DIM, dram_budget=1 << 20, ssd_dir=str(tmp_path / "missing"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="dram_budget .* and ssd_dir .* go together"):
        ops().ttf_embedding_table(dim=DIM, dram_budget=1 << 20, shared_name="ttf_tier_bad_attr")
    assert parse_size("2G") == 2 << 30 and parse_size("512M") == 512 << 20 and parse_size("64k") == 64 << 10
    assert parse_size("1000") == 1000 and parse_size("1.5GiB") == 3 << 29
    for bad in ("lots", "-1M", "", "12Q"):
        with pytest.raises(ValueError, match="size must be"):
            parse_size(bad)


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    import numpy as np, tensorflow as tf
    sys.path.insert(0, {tests!r})
    from test_table_tiers import DIM, sorted_export, train_step, zipf_batches
    from ttf.embedding import EmbeddingTable, tier_row_bytes
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    table = EmbeddingTable(DIM, num_shards=1, dram_budget=20 * tier_row_bytes(DIM, 2), ssd_dir={ssd!r})
    resource.setrlimit(resource.RLIMIT_FSIZE, (40 * 72, hard))  # room for 40 records (dim 4, Adam: 72 bytes)
    failed_at = None
    for step, keys in enumerate(zipf_batches(7, 200, batch=16), start=1):
        before = sorted_export(table)
        try:
            train_step(table, keys, step)
        except tf.errors.ResourceExhaustedError as err:
            assert "is full" in str(err) and "ssd_dir=" in str(err) and "--" not in str(err), err
            failed_at = step
            break
    assert failed_at, "the disk never filled"
    after = sorted_export(table)  # the failed step changed nothing (one shard: all or nothing)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b, a)
    stats = table.tier_stats()
    assert stats["disk_rows"] > 0 and stats["dram_rows"] + stats["disk_rows"] == len(after[0]), stats
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space again: the same step now succeeds
    train_step(table, keys, failed_at)
    print("ok", failed_at, stats["disk_rows"])
""")


@pytest.mark.slow
def test_a_full_disk_fails_the_step_cleanly_and_keeps_the_table(tmp_path):
    """A real size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as ENOSPC would on a
    full disk), in a child process so the limit binds nothing else."""
    code = FULL_DISK.format(tests=os.path.dirname(__file__), ssd=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok"), done.stdout


@pytest.mark.slow
def test_kill_9_of_a_tiered_job_then_a_restart_resumes_from_the_checkpoint(tmp_path):
    """The disk files are an unlinked cache: a killed job leaves nothing under --ssd-dir, and
    the restart restores every row (both tiers) from the last checkpoint."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ssd, ckpt = tmp_path / "ssd", tmp_path / "ckpt"
    command = [sys.executable, os.path.join(repo, "models", "train.py"), "--tiacc", "--data", "synthetic",
               "--synthetic-rows", "20000", "--cache-dir", str(tmp_path / "data"), "--steps", "400",
               "--checkpoint-every", "20", "--log-every", "20", "--dram-budget", "2M", "--ssd-dir", str(ssd),
               "--checkpoint-dir", str(ckpt)]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=repo,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        lines = []
        for line in job.stdout:
            lines.append(line)
            step = re.match(r"\[train\] step (\d+):.* disk,", line)
            if step and int(step.group(1)) >= 60:  # disk rows exist; saves at steps 20 and 40 are done
                break
        assert job.poll() is None, "".join(lines[-20:])
        job.kill()  # SIGKILL
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert os.listdir(ssd) == []
    killed_at = max(int(m) for m in re.findall(r"\[train\] step (\d+):", "".join(lines)))
    assert killed_at < 400
    command[command.index("400")] = str(killed_at + 40)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=repo)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "[train] resumed from" in output, output[-3000:]
    assert " disk, DRAM hit rate" in output, output[-3000:]


def test_crowded_disk_index_warns_once_naming_the_library_argument(tmp_path, capfd):
    """When a shard's disk index takes over half its share of dram_budget, the table says so
    once (C++ stderr), naming its own argument (dram_budget=), never a CLI's flag."""
    table = EmbeddingTable(DIM, num_shards=1, dram_budget=4096, ssd_dir=str(tmp_path))
    for start in range(0, 3000, 500):  # ~3,000 disk keys: an index of ~40 KB against a 4 KB budget
        ops().ttf_table_find_or_insert(table.resource_handle, np.arange(start, start + 500, dtype=np.int64), dim=DIM)
    err = capfd.readouterr().err
    assert err.count("ttf warning: the SSD tier's key index") == 1, err
    assert "Raise dram_budget=." in err and "--" not in err and "train.py" not in err, err
    assert table.tier_stats()["crowded_shards"] == 1
