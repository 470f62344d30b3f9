"""Opening a stream from its spec: `folder:DIR` or `kafka:HOST:PORT/TOPIC` (docs/streams.md)."""
import os

from ttf.data._stream import FolderStream, KafkaStream


def parse_stream_spec(spec):
    """`folder:DIR` -> ("folder", DIR); `kafka:HOST:PORT[,HOST:PORT]/TOPIC` -> ("kafka", (bootstrap, topic)).

    Raises:
      ValueError: a malformed spec (naming the expected form), a missing folder, or
        (kafka) confluent-kafka not installed.
    """
    kind, _, rest = spec.partition(":")
    if kind == "folder" and rest:
        if not os.path.isdir(rest):
            raise ValueError(f"stream folder not found: {rest}")
        return "folder", rest
    if kind == "kafka" and "/" in rest and rest.split("/", 1)[0] and rest.split("/", 1)[1]:
        try:
            import confluent_kafka  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        except ImportError as err:
            raise ValueError("a kafka stream needs confluent-kafka: pip install confluent-kafka") from err
        return "kafka", tuple(rest.split("/", 1))
    raise ValueError(f"a stream must be folder:DIR or kafka:HOST:PORT/TOPIC, got {spec!r}")


def read_kafka_config(path):
    """A Kafka client properties file (`key=value` lines, `#` comments: librdkafka's names,
    e.g. security.protocol=SASL_SSL, ssl.ca.location, sasl.mechanisms, sasl.username,
    sasl.password) -> {key: value}, passed to the consumer as they are.

    Raises:
      ValueError: a line that is not `key=value`, naming the file and line.
    """
    config = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{path}:{number}: expected key=value (a Kafka client property), got {line!r}")
            config[key.strip()] = value.strip()
    return config


def open_stream(spec, schema="criteo", share=0, num_shares=1, strict=True, poll_seconds=1.0, kafka_config=None):
    """A stream source from a spec (parse_stream_spec). Create it where its variables must
    live: in a parameter-server job under the strategy's scope, after connecting.
    kafka_config: extra consumer settings ({name: value}, e.g. TLS and SASL; see
    read_kafka_config), for a kafka spec only.

    Example:
      >>> import ttf
      >>> stream = ttf.data.open_stream("folder:/tmp")  # then stream.next_batch(4096), stream.commit(batch)
    """
    kind, where = parse_stream_spec(spec)
    if kind == "folder":
        if kafka_config:
            raise ValueError(f"Kafka settings were given for a folder stream ({spec}): drop them")
        return FolderStream(where, schema, share, num_shares, strict, poll_seconds)
    return KafkaStream(where[0], where[1], schema, share, num_shares, strict, poll_seconds, config=kafka_config)
