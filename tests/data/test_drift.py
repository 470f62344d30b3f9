"""ttf.data.DriftingSynthetic (weights drift, ids turn over, event times) against closed-form
expectations, and the producer's folder contract (whole files renamed into place, in name
order, read back by ttf.data.Reader to the generator's rows)."""
import math
import os

import numpy as np
import pytest

import ttf
from ttf.data import producer


def test_rows_are_a_pure_function_of_seed_and_hour():
    stream = ttf.data.DriftingSynthetic(vocab_per_field=1000)
    first, again = stream.hour_rows(3, 2000, seed=5), stream.hour_rows(3, 2000, seed=5)
    for name in ("ids", "dense", "label", "probability", "event_time"):
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.array_equal(first["ids"], stream.hour_rows(4, 2000, seed=5)["ids"])
    assert not np.array_equal(first["ids"], stream.hour_rows(3, 2000, seed=6)["ids"])


def test_weights_drift_at_the_stated_rate_and_keep_their_spread():
    stream = ttf.data.DriftingSynthetic(drift_rate=1 / 24)
    keys = np.arange(1, 200_001, dtype=np.int64) * 7919
    start = stream.at(0).key_weights(keys)
    # Within an anchor period the weight at hour h is cos(t) a_0 + sin(t) a_1, t = pi/2 * h/24.
    for hour in (6, 12, 24):
        later = stream.at(hour).key_weights(keys)
        expected = math.cos(math.pi / 2 * hour / 24) if hour < 24 else 0.0
        assert np.corrcoef(start, later)[0, 1] == pytest.approx(expected, abs=0.01)  # 200k keys: std ~0.002
        assert later.std() == pytest.approx(stream.key_weight_std, rel=0.01)
    fixed = ttf.data.DriftingSynthetic(drift_rate=0)
    np.testing.assert_array_equal(fixed.at(0).key_weights(keys), fixed.at(30).key_weights(keys))


def test_ids_turn_over_at_the_new_id_rate():
    ranks = np.arange(20_000, dtype=np.int64)
    stream = ttf.data.DriftingSynthetic(new_id_rate=0.03)
    start = stream.at(0)._population(0, ranks)  # pylint: disable=protected-access
    for hour in (1, 10, 40):
        moved = (stream.at(hour)._population(0, ranks) != start).mean()  # pylint: disable=protected-access
        assert moved == pytest.approx(min(1.0, 0.03 * hour), abs=0.01)  # 20k ranks: binomial std <= 0.0035
    still = ttf.data.DriftingSynthetic(new_id_rate=0)
    np.testing.assert_array_equal(still.at(0)._population(0, ranks),  # pylint: disable=protected-access
                                  still.at(50)._population(0, ranks))  # pylint: disable=protected-access
    assert (start >= 0).all() and (start < 1 << 32).all()  # 8 hex digits in a Criteo file


def test_event_times_cover_the_hour_in_order():
    stream = ttf.data.DriftingSynthetic(start_time=1_000_000).at(5)
    parts = [stream.event_times(1000, part, 4) for part in range(4)]
    joined = np.concatenate(parts)
    assert joined[0] == 1_000_000 + 5 * 3600 and joined[-1] < 1_000_000 + 6 * 3600
    assert (np.diff(joined) >= 0).all() and parts[1][0] == 1_000_000 + 5 * 3600 + 900


def test_bad_configuration_is_refused():
    for kwargs, message in (({"drift_rate": -1}, "drift_rate"), ({"new_id_rate": 1.5}, "new_id_rate"),
                            ({"hour": -1}, "hour must be")):
        with pytest.raises(ValueError, match=message):
            ttf.data.DriftingSynthetic(**kwargs)


def test_producer_writes_whole_files_in_name_order_and_continues(tmp_path, capsys):
    args = ["--out-dir", str(tmp_path), "--rows-per-hour", "301", "--files-per-hour", "2", "--interval", "0",
            "--vocab-per-field", "500", "--seed", "3"]
    assert producer.main(args + ["--hours", "2"]) == 0
    assert producer.main(args + ["--hours", "3"]) == 0  # a restart continues after the last file
    names = sorted(os.listdir(tmp_path))
    assert names == [f"part-{h:06d}-{p:03d}.txt" for h in range(3) for p in range(2)]  # no temporary file left
    assert "from hour 2 part 0" in capsys.readouterr().out
    # What a folder reader parses is what the generator drew for that part.
    stream = ttf.data.DriftingSynthetic(vocab_per_field=500).at(1)
    expected = stream.generate(150, seed=stream.hour_seed(3, part=1))  # part 1 of 2 holds 301 // 2 rows
    features, labels = next(iter(ttf.data.Reader(str(tmp_path / names[3]), "criteo").dataset(1000, shuffle=False)))
    np.testing.assert_array_equal(features["ids"].numpy(), expected["ids"])
    np.testing.assert_array_equal(labels.numpy(), expected["label"])


def test_producer_usage_errors_exit_2(tmp_path, capsys):
    for args, message in ((["--rows-per-hour", "5"], "--out-dir DIR and/or --kafka"),
                          (["--out-dir", str(tmp_path), "--files-per-hour", "0"], "--files-per-hour must be > 0"),
                          (["--out-dir", str(tmp_path), "--new-id-rate", "2"], "new_id_rate must be in")):
        with pytest.raises(SystemExit) as exit_info:
            producer.main(args)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_producer_kafka_without_the_client_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "confluent_kafka", None)  # as if not installed
    with pytest.raises(SystemExit, match="pip install confluent-kafka"):
        producer.main(["--kafka", "127.0.0.1:9092/ctr", "--hours", "1", "--interval", "0"])
