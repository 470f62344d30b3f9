"""librdkafka's mock Kafka cluster, driven through ctypes, for the stream tests.

confluent-kafka starts a mock cluster for a client given `test.mock.num.brokers`, but
does not expose the cluster handle: neither its bootstrap address for other processes
nor `rd_kafka_mock_broker_set_down`. The wheel's bundled librdkafka exports the mock API
(`rd_kafka_mock_cluster_new`, `_bootstraps`, `_topic_create`, `_broker_set_down/_up`), so
this module calls it directly: real brokers on loopback speaking the Kafka protocol,
inside this process's librdkafka threads, reachable by a trainer in another process.
"""
import ctypes
import glob
import os

import confluent_kafka


def _library():
    libs = os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)), "confluent_kafka.libs")
    found = glob.glob(os.path.join(libs, "librdkafka*.so*"))
    if not found:
        raise RuntimeError(f"no bundled librdkafka in {libs}: the mock cluster needs confluent-kafka's wheel")
    lib = ctypes.CDLL(found[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_mock_broker_set_down.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_up.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    return lib


class MockKafkaCluster:
    """A mock cluster of `brokers` brokers (ids 1..brokers) on loopback.

    Example:
      cluster = MockKafkaCluster(3)
      cluster.create_topic("clicks", partitions=4)
      Producer({"bootstrap.servers": cluster.bootstrap}) ...
      cluster.broker_down(1); ...; cluster.broker_up(1)
      cluster.close()
    """

    def __init__(self, brokers=3):
        self._lib = _library()
        errstr = ctypes.create_string_buffer(512)
        self._client = self._lib.rd_kafka_new(0, self._lib.rd_kafka_conf_new(), errstr, len(errstr))  # a producer
        if not self._client:
            raise RuntimeError(f"rd_kafka_new failed: {errstr.value.decode()}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._client, brokers)
        if not self._cluster:
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap = self._lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()
        self.brokers = brokers

    def create_topic(self, topic, partitions, replication=1):
        code = self._lib.rd_kafka_mock_topic_create(self._cluster, topic.encode(), partitions, replication)
        if code != 0:
            raise RuntimeError(f"rd_kafka_mock_topic_create({topic!r}) failed: error {code}")

    def broker_down(self, broker_id):
        """Closes the broker's connections and refuses new ones (its partitions stall)."""
        self._lib.rd_kafka_mock_broker_set_down(self._cluster, broker_id)

    def broker_up(self, broker_id):
        self._lib.rd_kafka_mock_broker_set_up(self._cluster, broker_id)

    def close(self):
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._lib.rd_kafka_destroy(self._client)
            self._cluster = self._client = None


def produce_lines(bootstrap, topic, lines, partitions, first_index=0):
    """Sends each line as one message, line i (counting from first_index) to partition
    i % partitions, in order; waits until all are acked."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                         "enable.idempotence": True})  # no reordering on a retry
    for i, line in enumerate(lines, start=first_index):
        producer.produce(topic, line.encode(), partition=i % partitions)
        if i % 1000 == 999:
            producer.poll(0)
    left = producer.flush(30)
    if left:
        raise RuntimeError(f"{left} message(s) not delivered to {topic!r} in 30 s")
