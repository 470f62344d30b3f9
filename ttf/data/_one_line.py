"""A reader's dataset whose bad-input errors read as the one line the parser wrote.

Iterated eagerly, an error raised inside a tf.data function comes with TensorFlow's frame
around it: `{{function_node __inference_Dataset_map_parse_12}} Error in user-defined function passed to
ParallelMapDatasetV2:2 transformation with iterator: Iterator::Root::...: x.tsv:5: bad criteo
line: ... [[{{node TtfParseLines}}]] [Op:IteratorGetNext]`. The reader's datasets strip the frame, so
`for batch in reader.dataset(...)` fails with the line alone (same exception type).
"""
import re

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops, iterator_ops  # pylint: disable=no-name-in-module

_FRAME = re.compile(r"^(\{\{function_node [^}]*\}\}\s*|Error in user-defined function passed to \S+ transformation "
                    r"with iterator: \S+: )+")


def one_line(message):
    """The parser's line of a TensorFlow error message: no function prefix, no node or op suffix."""
    message = _FRAME.sub("", message.strip())
    return re.split(r"\s*\n|\s*\[\[\{\{node |\s*\[Op:", message, maxsplit=1)[0].strip()


class _OneLineIterator(iterator_ops.OwnedIterator):
    def _next_internal(self):
        try:
            return super()._next_internal()
        except tf.errors.OpError as err:
            line = one_line(err.message)
            if not line or line == err.message:
                raise
            raise type(err)(err.node_def, err.op, line) from None


class OneLineErrors(dataset_ops.UnaryUnchangedStructureDataset):
    """`dataset` as it is, iterated eagerly with one-line errors (see the module's doc)."""

    def __init__(self, dataset):
        super().__init__(dataset, dataset._variant_tensor)  # pylint: disable=protected-access

    def __iter__(self):
        if tf.executing_eagerly():
            return _OneLineIterator(self)
        return super().__iter__()
