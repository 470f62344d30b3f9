"""What crosses the wire of a synchronous job: float32, or 16 bits (fp16 / bf16) cast on
the way out and back to float32 on arrival (sums are taken in float32, never in 16 bits)."""
import tensorflow as tf

COMPRESSIONS = ("none", "fp16", "bf16")
_WIRE_DTYPES = {"none": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}


def wire_dtype(compression):
    """The dtype `compression` sends floats in; ValueError naming the choices otherwise."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    return _WIRE_DTYPES[compression]


def to_wire(values, dtype):
    """float32 -> what crosses the wire. bfloat16 travels bit-cast as int16: Horovod's
    alltoall and allgather move bytes but take no bfloat16 (the TF backend bit-casts int16
    to a 16-bit type its collectives take)."""
    if dtype == tf.float32:
        return values
    values = tf.cast(values, dtype)
    return tf.bitcast(values, tf.int16) if dtype == tf.bfloat16 else values


def from_wire(values, dtype):
    if dtype == tf.bfloat16:
        values = tf.bitcast(values, tf.bfloat16)
    return tf.cast(values, tf.float32)


def itemsize(dtype):
    return 4 if dtype == tf.float32 else 2
