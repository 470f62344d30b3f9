"""Input split into disjoint shares (Reader.share_dataset) and the checkpointed reading
position (InputPosition): every row once per epoch across the shares, and a restored
position continues exactly where the checkpoint was taken."""
import gzip

import numpy as np
import pytest
import tensorflow as tf

import ttf


def write_rows(path, rows, header=False, crlf=False, final_newline=True):
    """Criteo TSV rows whose first dense column is the row's index (a fingerprint)."""
    end = "\r\n" if crlf else "\n"
    lines = [f"{i % 2}\t{i}" + "\t" * 12 + "\t" + "\t".join(f"{i * 7 + f:x}" for f in range(26)) for i in rows]
    text = (ttf.data.CSV_HEADER.replace(",", "\t") + end if header else "") + end.join(lines)
    text += end if final_newline else ""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", newline="") as f:
        f.write(text)
    return path


def row_ids(dataset):
    """The fingerprints (first raw dense value) of every row of a share dataset, in order."""
    ids = [np.round(np.expm1(f["dense"][:, 0].numpy())).astype(np.int64) for f, _, _ in dataset]
    return np.concatenate(ids) if ids else np.zeros([0], np.int64)


@pytest.fixture
def files(tmp_path):
    return [str(write_rows(tmp_path / "a.tsv", range(0, 700))),
            str(write_rows(tmp_path / "b.tsv", range(700, 1000), crlf=True, final_newline=False)),
            str(write_rows(tmp_path / "c.tsv.gz", range(1000, 1250)))]


@pytest.mark.parametrize("num_shares", [2, pytest.param(5, marks=pytest.mark.slow)])
def test_shares_are_disjoint_and_cover_every_row_once(files, num_shares):
    reader = ttf.data.CriteoReader(files)
    shares = [row_ids(reader.share_dataset(32, i, num_shares, window_lines=100)) for i in range(num_shares)]
    together = np.concatenate(shares)
    np.testing.assert_array_equal(np.sort(together), np.arange(1250))  # each row once, none lost
    if num_shares > 1:  # about equal bytes: no share holds more than half again its even part
        assert max(len(s) for s in shares) <= 1.5 * 1250 / num_shares + 250, [len(s) for s in shares]


def test_held_out_split_uses_the_files_line_numbers(tmp_path):
    path = str(write_rows(tmp_path / "h.tsv", range(500), header=True))
    reader = ttf.data.CriteoReader([path])
    train = np.concatenate([row_ids(reader.share_dataset(16, i, 3, split="train")) for i in range(3)])
    evals = np.concatenate([row_ids(reader.share_dataset(16, i, 3, split="eval")) for i in range(3)])
    # Line n (1-based, the header is line 1) holds row n - 2; every 5th line is held out.
    np.testing.assert_array_equal(np.sort(evals), [n - 2 for n in range(5, 502, 5)])
    assert len(train) + len(evals) == 500 and not set(train) & set(evals)


def test_batches_stay_within_a_window_and_carry_their_position(files):
    reader = ttf.data.CriteoReader(files[:1])
    batches = list(reader.share_dataset(32, 0, 1, window_lines=100, shuffle=False))
    sizes = [int(labels.shape[0]) for _, labels, _ in batches]
    assert sizes == [32, 32, 32, 4] * 7  # 700 lines: 7 windows of 100 rows, no batch across two
    position = dict(zip(ttf.data.POSITION_FIELDS, batches[3][2].numpy()))
    line_bytes = len(open(files[0], "rb").readline())
    assert position["last"] == 1 and position["start_byte"] == 0 and position["start_line"] == 1
    assert position["end_line"] == 101 and position["end_byte"] > 99 * line_bytes


@pytest.mark.parametrize("stop_after", [3, pytest.param(17, marks=pytest.mark.slow)])
def test_a_restored_position_continues_exactly(files, stop_after):
    """Train (record) some batches, checkpoint, restore into a new tracker and read on: the rows
    of both runs are exactly the rows of one uninterrupted run, in order (2 epochs, 2 shares)."""
    reader = ttf.data.CriteoReader(files)
    kwargs = dict(seed=3, num_epochs=2, window_lines=64)
    for share in range(2):
        whole = row_ids(reader.share_dataset(24, share, 2, **kwargs))
        position = ttf.data.InputPosition(2)
        first = []
        for i, (features, labels, where) in enumerate(reader.share_dataset(24, share, 2, position=position, **kwargs)):
            if i == stop_after:
                break
            first.append(np.round(np.expm1(features["dense"][:, 0].numpy())).astype(np.int64))
            position.record(where, tf.size(labels))
        path = tf.train.Checkpoint(input_position=position).write(str(files[0]) + f".ckpt{share}")
        restored = ttf.data.InputPosition(2)
        tf.train.Checkpoint(input_position=restored).read(path).assert_consumed()
        rest = row_ids(reader.share_dataset(24, share, 2, position=restored, **kwargs))
        np.testing.assert_array_equal(np.concatenate(first + [rest]), whole)
        assert restored.examples_trained() == sum(len(f) for f in first)


def test_a_position_of_another_split_warns_and_starts_over(files, capsys):
    reader = ttf.data.CriteoReader(files)
    position = ttf.data.InputPosition(2)
    _, labels, where = next(iter(reader.share_dataset(16, 0, 2, position=position)))
    position.record(where, tf.size(labels))
    other = ttf.data.CriteoReader(files[:2])  # the files changed: the saved bytes mean nothing there
    rows = row_ids(other.share_dataset(16, 0, 2, position=position))
    assert "belongs to another split of the input" in capsys.readouterr().err
    assert len(rows) > 0 and rows.min() == 0


def test_bad_arguments_are_refused(files):
    reader = ttf.data.CriteoReader(files)
    with pytest.raises(ValueError, match=r"share must be in \[0, 2\), got 2"):
        reader.share_dataset(16, 2, 2)
    with pytest.raises(ValueError, match="num_shares must be > 0"):
        reader.share_dataset(16, 0, 0)
    with pytest.raises(ValueError, match="the InputPosition has 3 share"):
        reader.share_dataset(16, 0, 2, position=ttf.data.InputPosition(3))


def test_a_finished_share_yields_nothing(files):
    reader = ttf.data.CriteoReader(files[:1])
    position = ttf.data.InputPosition(1)
    for _, labels, where in reader.share_dataset(100, 0, 1, position=position, num_epochs=1):
        position.record(where, tf.size(labels))
    assert position.examples_trained() == 700
    assert row_ids(reader.share_dataset(100, 0, 1, position=position, num_epochs=1)).size == 0
    assert row_ids(reader.share_dataset(100, 0, 1, position=position, num_epochs=2)).size == 700
