"""Stream sources (ttf.data.FolderStream, KafkaStream): parsing, example ids, the position
in a checkpoint, resuming exactly there, partition shares, a broker outage.

Reference: the lines of the files / messages as written, parsed by ttf.data.parse_lines
(the file reader's op), compared exactly (ids equal, dense values equal: same op, same
input). Kafka tests run against librdkafka's mock cluster (tests/data/kafka_mock.py).
"""
import os
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import ttf
from ttf.data import ID_SHIFT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data",
                      "criteo_sample.txt")


def sample_lines():
    with open(SAMPLE, encoding="utf-8") as f:
        return f.read().splitlines()[1:]  # no header: 200 rows


def drop(directory, name, lines, header=None):
    """Writes a file as a producer must: under a .tmp name, then renamed into place."""
    tmp = os.path.join(directory, name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in ([header] if header else []) + lines))
    os.rename(tmp, os.path.join(directory, name))


def drain(stream, batch_size, limit):
    """Reads and commits batches until `limit` examples; returns (ids, labels, ids features)."""
    ids, labels, keys = [], [], []
    while len(ids) < limit:
        batch = stream.next_batch(batch_size)
        assert batch is not None
        stream.commit(batch)
        ids += batch.example_ids.tolist()
        labels.append(batch.labels.numpy())
        keys.append(batch.features["ids"].numpy())
    return ids, np.concatenate(labels), np.concatenate(keys)


def test_folder_stream_reads_files_once_in_name_order_with_ids(tmp_path):
    lines = sample_lines()
    drop(tmp_path, "part-001", lines[:70], header=ttf.data.CSV_HEADER)  # a header line is skipped
    drop(tmp_path, "part-000", lines[70:120])
    (tmp_path / ".hidden").write_text(lines[0] + "\n")  # ignored: dotfile
    (tmp_path / "part-002.tmp").write_text(lines[0] + "\n")  # ignored: still being written
    stream = ttf.data.FolderStream(str(tmp_path), poll_seconds=0.05)
    ids, labels, keys = drain(stream, 32, 120)
    # Name order: part-000 (file 0, lines 1..50) then part-001 (file 1, lines 2..71 after its header).
    expected_ids = [(0 << ID_SHIFT) | n for n in range(1, 51)] + [(1 << ID_SHIFT) | n for n in range(2, 72)]
    assert ids == expected_ids
    features, expected_labels, _ = ttf.data.parse_lines(lines[70:120] + lines[:70], "x", list(range(1, 121)))
    np.testing.assert_array_equal(labels, expected_labels.numpy())
    np.testing.assert_array_equal(keys, features["ids"].numpy())
    assert stream.update_progress()["lag_bytes"] == 0


def test_folder_stream_resumes_exactly_from_a_checkpoint(tmp_path):
    data, ckpt = tmp_path / "in", tmp_path / "ckpt"
    data.mkdir()
    lines = sample_lines()
    for i in range(4):
        drop(data, f"part-{i:03d}", lines[i * 50:(i + 1) * 50])
    first = ttf.data.FolderStream(str(data), poll_seconds=0.05)
    ids_before, _, _ = drain(first, 30, 90)  # 3 batches: ends inside the second file
    saved = tf.train.Checkpoint(stream_position=first).save(str(ckpt / "c"))
    drain(first, 30, 30)  # trained after the checkpoint: lost with the process
    resumed = ttf.data.FolderStream(str(data), poll_seconds=0.05)
    tf.train.Checkpoint(stream_position=resumed).restore(saved).assert_existing_objects_matched()
    ids_after, _, _ = drain(resumed, 30, 110)
    everything = [(f << ID_SHIFT) | n for f in range(4) for n in range(1, 51)]
    assert ids_before + ids_after == everything  # neither skipped nor repeated
    assert int(resumed.examples.numpy()) == 200


def test_folder_stream_waits_for_files_and_stops(tmp_path):
    stream = ttf.data.FolderStream(str(tmp_path), poll_seconds=0.05)
    timer = threading.Timer(0.3, lambda: drop(tmp_path, "a", sample_lines()[:5]))
    timer.start()
    batch = stream.next_batch(100)  # waits for the file, then one poll interval for more
    timer.join()
    assert batch.example_ids.tolist() == list(range(1, 6))
    stream.commit(batch)
    threading.Timer(0.3, stream.stop).start()
    assert stream.next_batch(100) is None  # stop() ends the wait


def test_folder_stream_bad_input(tmp_path):
    with pytest.raises(ValueError, match="stream folder not found"):
        ttf.data.FolderStream(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="a stream must be folder:DIR or kafka:HOST:PORT/TOPIC"):
        ttf.data.open_stream("kafka:localhost:9092")
    with pytest.raises(ValueError, match="poll_seconds must be > 0"):
        ttf.data.FolderStream(str(tmp_path), poll_seconds=0)
    drop(tmp_path, "a", sample_lines()[:3] + ["1\tnot-a-number"])
    stream = ttf.data.FolderStream(str(tmp_path), poll_seconds=0.05)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"a:4: bad criteo line"):
        stream.next_batch(10)


def test_folder_stream_shares_split_files(tmp_path):
    lines = sample_lines()
    for i in range(8):
        drop(tmp_path, f"f{i}", lines[i * 25:(i + 1) * 25])
    seen = []
    for share in range(2):
        stream = ttf.data.FolderStream(str(tmp_path), share=share, num_shares=2, poll_seconds=0.05)
        seen.append(stream.next_batch(1000).example_ids.tolist())  # every file of the share, then a poll
    # Each file in exactly one share; ids unique over the shares: file number sequence * 2 + share.
    assert len(seen[0]) + len(seen[1]) == 200 and seen[0] and seen[1]
    assert len(set(seen[0]) | set(seen[1])) == 200 and len(seen[0]) % 25 == 0
    assert {i >> ID_SHIFT for i in seen[1]} <= {1, 3, 5, 7, 9, 11, 13, 15}


def read_shares(streams, batch_size, limit):
    """Round-robin over the shares (as ranks step together), committing, until `limit` ids
    or every share stayed empty for 5 rounds; returns the ids."""
    ids, idle = [], 0
    while len(ids) < limit and idle < 5:
        batches = [stream.next_batch(batch_size, block=False) for stream in streams]
        idle = idle + 1 if all(b is None for b in batches) else 0
        for stream, batch in zip(streams, batches):
            batch = batch if batch is not None else stream.empty_batch()
            stream.commit(batch)
            ids += batch.example_ids.tolist()
    return ids


def merged_checkpoint(streams, path):
    """What a Horovod job does before a save (tdh.gather_stream_position), then share 0 saves."""
    states = [stream.share_state() for stream in streams]
    for stream in streams:
        stream.merge_shares(states)
    return tf.train.Checkpoint(stream_position=streams[0]).save(path)


def test_folder_shares_merge_into_one_checkpoint_and_resume_exactly(tmp_path):
    """Two shares read, merge their positions, share 0 saves; two fresh shares restore that one
    checkpoint, adopt their own parts and read the rest: every line once. The examples count
    is the sum over the shares. Another number of shares is refused, naming both counts."""
    incoming = tmp_path / "in"
    incoming.mkdir()
    lines = sample_lines()
    for i in range(8):
        drop(incoming, f"f{i}", lines[i * 25:(i + 1) * 25])
    first = [ttf.data.FolderStream(str(incoming), share=s, num_shares=2, poll_seconds=0.05) for s in range(2)]
    before = read_shares(first, 10, 60)
    saved = merged_checkpoint(first, str(tmp_path / "c"))
    assert int(first[1].examples.numpy()) == len(before)  # every share's count, on every share
    read_shares(first, 10, 30)  # lost with the job
    again = [ttf.data.FolderStream(str(incoming), share=s, num_shares=2, poll_seconds=0.05) for s in range(2)]
    for stream in again:
        tf.train.Checkpoint(stream_position=stream).restore(saved).assert_existing_objects_matched()
        stream.adopt_share()
    after = read_shares(again, 10, 1000)
    assert sorted(before + after) == sorted(set(before + after)) and len(before + after) == 200
    states = [stream.share_state() for stream in again]
    assert sum(state["examples"] for state in states) == len(after)
    one = ttf.data.FolderStream(str(incoming), poll_seconds=0.05)
    tf.train.Checkpoint(stream_position=one).restore(saved)
    with pytest.raises(ValueError, match=r"written by a job of 2 share\(s\) \(ranks\), this job reads it in 1: .*"
                                         r"resume with 2 rank\(s\)"):
        one.adopt_share()
    with pytest.raises(ValueError, match="merge_shares needs the states of shares 0..1 in order"):
        first[0].merge_shares([first[1].share_state(), first[0].share_state()])


kafka_mock = pytest.importorskip("kafka_mock", reason="confluent-kafka is not installed")


@pytest.fixture
def cluster():
    mock = kafka_mock.MockKafkaCluster(3)
    yield mock
    mock.close()


def test_kafka_stream_resumes_exactly_and_splits_partitions(cluster, tmp_path):
    lines = sample_lines()
    cluster.create_topic("clicks", 4)
    kafka_mock.produce_lines(cluster.bootstrap, "clicks", lines, 4)
    first = ttf.data.KafkaStream(cluster.bootstrap, "clicks", poll_seconds=0.2)
    ids_before, _, _ = drain(first, 40, 80)
    saved = tf.train.Checkpoint(stream_position=first).save(str(tmp_path / "c"))
    saved_offsets = first.offsets.numpy().tolist()
    drain(first, 40, 40)  # lost with the process
    first.close()
    resumed = ttf.data.KafkaStream(cluster.bootstrap, "clicks", poll_seconds=0.2)
    tf.train.Checkpoint(stream_position=resumed).restore(saved).assert_existing_objects_matched()
    ids_after, _, _ = drain(resumed, 40, 120)
    resumed.close()
    everything = sorted((i % 4 << ID_SHIFT) | (i // 4) for i in range(200))  # line i: partition i % 4
    assert sorted(ids_before + ids_after) == everything
    assert len(set(ids_before) & set(ids_after)) == 0
    # A checkpoint of a topic with fewer partitions restores (new partitions start at their
    # beginning); one with more is refused by name.
    cluster.create_topic("wider", 6)
    wider = ttf.data.KafkaStream(cluster.bootstrap, "wider", poll_seconds=0.2)
    tf.train.Checkpoint(stream_position=wider).restore(saved).assert_existing_objects_matched()
    np.testing.assert_array_equal(wider._committed(), saved_offsets + [-1, -1])  # pylint: disable=protected-access
    wider.close()
    cluster.create_topic("narrower", 2)
    narrower = ttf.data.KafkaStream(cluster.bootstrap, "narrower", poll_seconds=0.2)
    tf.train.Checkpoint(stream_position=narrower).restore(saved)
    with pytest.raises(ValueError, match="partitions cannot be removed"):
        narrower.next_batch(10)
    narrower.close()
    # Shares: partition p to share p % 2.
    shares = [ttf.data.KafkaStream(cluster.bootstrap, "clicks", share=s, num_shares=2, poll_seconds=0.2)
              for s in range(2)]
    for share, stream in enumerate(shares):
        ids, _, _ = drain(stream, 100, 100)
        assert {i >> ID_SHIFT for i in ids} == {share, share + 2}
        stream.close()


def test_kafka_shares_merge_into_one_checkpoint_that_resumes_in_any_number(cluster, tmp_path):
    """Two shares read a 4-partition topic and merge their offsets; share 0's checkpoint
    resumes in one share and in three: every message once."""
    lines = sample_lines()
    cluster.create_topic("clicks", 4)
    kafka_mock.produce_lines(cluster.bootstrap, "clicks", lines, 4)
    two = [ttf.data.KafkaStream(cluster.bootstrap, "clicks", share=s, num_shares=2, poll_seconds=0.2) for s in range(2)]
    before = read_shares(two, 15, 60)
    saved = merged_checkpoint(two, str(tmp_path / "c"))
    for stream in two:
        stream.close()
    everything = sorted((i % 4 << ID_SHIFT) | (i // 4) for i in range(200))
    for count in (1, 3):
        streams = [ttf.data.KafkaStream(cluster.bootstrap, "clicks", share=s, num_shares=count, poll_seconds=0.2)
                   for s in range(count)]
        for stream in streams:
            tf.train.Checkpoint(stream_position=stream).restore(saved).assert_existing_objects_matched()
            stream.adopt_share()
        assert int(streams[-1].examples.numpy()) == len(before)  # the checkpoint's count of both shares
        after = read_shares(streams, 15, 1000)
        assert sorted(before + after) == everything, count
        for stream in streams:
            stream.close()


def test_kafka_stream_waits_through_a_broker_outage(cluster, capfd):
    lines = sample_lines()
    cluster.create_topic("clicks", 2)
    kafka_mock.produce_lines(cluster.bootstrap, "clicks", lines[:100], 2)
    stream = ttf.data.KafkaStream(cluster.bootstrap, "clicks", poll_seconds=0.2)
    ids, _, _ = drain(stream, 50, 100)

    def outage():
        for broker in range(1, cluster.brokers + 1):
            cluster.broker_down(broker)
        time.sleep(3)
        for broker in range(1, cluster.brokers + 1):
            cluster.broker_up(broker)
        kafka_mock.produce_lines(cluster.bootstrap, "clicks", lines[100:], 2)

    thread = threading.Thread(target=outage)
    thread.start()
    more, _, _ = drain(stream, 50, 100)  # waits through the outage, then reads the rest
    thread.join()
    stream.close()
    assert sorted(ids + more) == sorted((i % 2 << ID_SHIFT) | (i // 2) for i in range(200))
    err = capfd.readouterr().err
    assert err.count("[stream] waiting: kafka brokers unreachable") == 1 and "[stream] resumed" in err


def test_next_batch_without_blocking_returns_none_on_an_empty_stream(tmp_path):
    stream = ttf.data.FolderStream(str(tmp_path), poll_seconds=0.05)
    assert stream.next_batch(10, block=False) is None
    drop(tmp_path, "a", sample_lines()[:3])
    assert stream.next_batch(10, block=False).example_ids.tolist() == [1, 2, 3]


def test_kafka_stream_names_messages_deleted_before_training(cluster, capfd):
    # The mock cluster keeps about the last 20,000 messages of a partition: 25,000 lose the first ones.
    cluster.create_topic("short", 1)
    kafka_mock.produce_lines(cluster.bootstrap, "short", sample_lines()[:1] * 25_000, 1)
    stream = ttf.data.KafkaStream(cluster.bootstrap, "short", poll_seconds=0.2)
    stream.offsets.assign([0])  # a checkpoint taken at offset 0
    batch = stream.next_batch(10)
    stream.close()
    first = int(batch.example_ids[0])
    assert first > 0  # the oldest messages are gone: the next one available comes
    assert f"partition 0: offsets 0..{first - 1} are gone" in capfd.readouterr().err


def test_kafka_client_properties_reach_the_consumer(cluster, tmp_path):
    """TLS/SASL settings (--kafka-config) go to the real client as they are: a client id is
    accepted and streams; a CA file that does not exist is the client's own error, naming it."""
    cluster.create_topic("clicks", 1)
    kafka_mock.produce_lines(cluster.bootstrap, "clicks", sample_lines()[:20], 1)
    good = tmp_path / "client.properties"
    good.write_text("# our cluster\nclient.id = ttf-test\n\n")
    assert ttf.data.read_kafka_config(str(good)) == {"client.id": "ttf-test"}
    stream = ttf.data.open_stream(f"kafka:{cluster.bootstrap}/clicks", kafka_config=ttf.data.read_kafka_config(str(good)))
    ids, _, _ = drain(stream, 8, 20)
    assert sorted(ids) == list(range(20))  # partition 0, offsets 0..19
    stream.close()
    tls = tmp_path / "tls.properties"
    tls.write_text("security.protocol=ssl\nssl.ca.location=/nonexistent/ca.pem\n")
    with pytest.raises(Exception, match="ssl.ca.location|/nonexistent/ca.pem"):
        ttf.data.open_stream(f"kafka:{cluster.bootstrap}/clicks", kafka_config=ttf.data.read_kafka_config(str(tls)))
    bad = tmp_path / "bad.properties"
    bad.write_text("client.id=x\nnot a property\n")
    with pytest.raises(ValueError, match=r"bad.properties:2: expected key=value"):
        ttf.data.read_kafka_config(str(bad))
    with pytest.raises(ValueError, match="Kafka settings were given for a folder stream"):
        ttf.data.open_stream(f"folder:{tmp_path}", kafka_config={"client.id": "x"})


def rolled_back_in_place(stream, ckpt):
    """Reads and commits 2 batches, checkpoints, reads (and commits) 2 more, restores the
    checkpoint into the same stream and rewinds it (what a job rolling back does); returns
    the ids before the checkpoint and those read after the rewind."""
    before, _, _ = drain(stream, 30, 60)
    saved = tf.train.Checkpoint(stream_position=stream).save(str(ckpt))
    drain(stream, 30, 60)  # rolled back below
    stream.next_batch(30)  # read ahead, never committed
    tf.train.Checkpoint(stream_position=stream).restore(saved).assert_existing_objects_matched()
    stream.rewind()
    after, _, _ = drain(stream, 30, 60)
    return before, after


def test_folder_stream_rewinds_to_a_restored_position(tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    lines = sample_lines()
    for i in range(4):
        drop(data, f"part-{i:03d}", lines[i * 50:(i + 1) * 50])
    before, after = rolled_back_in_place(ttf.data.FolderStream(str(data), poll_seconds=0.05), tmp_path / "c")
    everything = [(f << ID_SHIFT) | n for f in range(4) for n in range(1, 51)]
    assert before + after == everything[:120]  # after the rewind: the examples just after the checkpoint


def test_kafka_stream_rewinds_to_a_restored_position(cluster, tmp_path):
    cluster.create_topic("rewind", 2)
    kafka_mock.produce_lines(cluster.bootstrap, "rewind", sample_lines(), 2)
    stream = ttf.data.KafkaStream(cluster.bootstrap, "rewind", poll_seconds=0.2)
    before, after = rolled_back_in_place(stream, tmp_path / "c")
    stream.close()
    assert len(set(before) | set(after)) == 120  # neither repeated nor skipped past the restored offsets
    offsets = {p: sorted(i & ((1 << ID_SHIFT) - 1) for i in before + after if i >> ID_SHIFT == p) for p in (0, 1)}
    assert all(o == list(range(len(o))) for o in offsets.values())  # each partition from its start, no gap


def test_an_idle_stream_calls_on_idle_at_every_poll(tmp_path):
    """A job publishes its last trained rows while the stream is idle: a blocking next_batch
    calls stream.on_idle at each poll while there is nothing to read (models/train.py sets it
    to its publisher), and not once a batch is there."""
    stream = ttf.data.FolderStream(str(tmp_path), poll_seconds=0.05)
    calls = []

    def idle():
        calls.append(time.monotonic())
        if len(calls) == 3:
            stream.stop()

    stream.on_idle = idle
    assert stream.next_batch(8) is None  # stopped from its third idle call
    assert len(calls) == 3
    stream.stop_event.clear()
    drop(tmp_path, "part-000", sample_lines()[:8])
    assert len(stream.next_batch(8).example_ids) == 8
    assert len(calls) == 3  # a file was there: no idle call
