"""A job's set-up checks: each misuse is one ValueError naming the fix, raised before the
first step is traced (rather than a TensorFlow traceback from inside it, or silent damage)."""
import warnings

import tensorflow as tf

from ttf.embedding import tables_in
from ttf.optimizers import from_keras

_SHAPE_ONLY = {"Identity", "Cast", "Reshape", "Squeeze", "ExpandDims", "IdentityN"}
_EXPECTED = "Job trains a model that returns one logit per example, shape [B] or [B, 1]"


def check_reachable(topology, directory):
    """Each parameter server writes its own rows into `directory`: it must see the folder the
    chief made (a shared file system or a bucket), or the first save would fail."""
    if not topology.shard_devices or directory is None:
        return
    tf.io.gfile.makedirs(directory)
    for device in dict.fromkeys(topology.shard_devices):
        with tf.device(device):
            found = tf.io.matching_files(directory)
        if int(tf.size(found)) == 0:
            raise ValueError(f"the task {device} cannot see checkpoint_dir {directory} (it writes its own rows "
                             "there): give a folder every task of the cluster reaches, on a shared file system or "
                             "a bucket (gs://, s3://, hdfs://)")


def check_in_scope(topology, model, optimizer):
    """A parameter-server job's model and optimizer must be made inside topology.scope()."""
    strategy = topology.strategy
    if strategy is None:
        return
    # A Keras 3 variable holds its TensorFlow variable as .value.
    variables = [v if isinstance(v, tf.Variable) else getattr(v, "value", None) for v in model.variables]
    outside = [v for v in variables
               if isinstance(v, tf.Variable) and not strategy.extended.variable_created_in_scope(v)]
    if outside:
        raise ValueError(f"the model's variables (e.g. {outside[0].name}) were made outside topology.scope(): on a "
                         f"{topology.name} job build the model and optimizer inside `with topology.scope():`")
    iterations = getattr(optimizer, "_iterations", None)
    iterations = iterations if isinstance(iterations, tf.Variable) else getattr(iterations, "value", None)
    if isinstance(iterations, tf.Variable) and not strategy.extended.variable_created_in_scope(iterations):
        raise ValueError("the optimizer was made outside topology.scope(): on a "
                         f"{topology.name} job make it inside `with topology.scope():` with the model")


def job_optimizer(model, optimizer):
    """The optimizer a job trains with: a stock Keras one becomes its ttf twin (same
    hyperparameters) with a warning when the model has ttf tables; one without a twin is
    refused in one line."""
    if not tables_in(model) or type(optimizer).__module__.startswith("ttf."):
        return optimizer
    try:
        converted = from_keras(optimizer)
    except ValueError as error:
        raise ValueError(f"{error}; the model's ttf tables train only with ttf.optimizers (Adam, AdamW, Adagrad, "
                         "Ftrl, SGD): give one of them") from None
    warnings.warn(f"Job: the Keras {type(optimizer).__name__} cannot update ttf tables; training with "
                  f"ttf.optimizers.{type(converted).__name__} (same hyperparameters). Pass a ttf optimizer to "
                  "silence this.", stacklevel=3)
    return converted


def call_on(layer, features, what):
    """`layer(features, training=False)`; a model that cannot take the input's features
    (`what` names them) is one ValueError naming them and Keras' reason."""
    try:
        return layer(features, training=False)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        shapes = ", ".join(f"{k}: {_spec(v)}" for k, v in features.items()) if isinstance(features, dict) else ""
        raise ValueError(f"the model cannot take {what} ({shapes}): {first}") from None


def check_output(forward, features, what):
    """Runs `forward` (what the job trains) once on `features` (a small batch of the input:
    `what` names it) and checks its output is one logit per example. Raises one ValueError
    naming the fix."""
    outputs = call_on(forward, features, what)
    if isinstance(outputs, (dict, list, tuple)):
        kind = f"a dict {sorted(outputs)}" if isinstance(outputs, dict) else f"a {type(outputs).__name__}"
        raise ValueError(f"the model returns {kind}; {_EXPECTED}: return that tensor, or give Job(forward=a layer "
                         "returning it)")
    shape = list(outputs.shape)
    batch = _batch_of(features)
    if not (shape == [batch] or shape == [batch, 1]):
        raise ValueError(f"the model returns shape {shape} for a batch of {batch}; {_EXPECTED} (e.g. a final "
                         "Dense(1) without activation)")
    final = _final_op(forward, features)
    if final in ("Sigmoid", "Softmax"):
        raise ValueError(f"the model's output comes from a {final.lower()}; {_EXPECTED} before any sigmoid (the "
                         "job's loss and evaluate apply it): drop the final activation (ttf.export_for_serving then "
                         "serves 'logits'), or give Job(forward=a layer returning the logit)")


def _final_op(forward, features):
    """The type of the op that makes `forward`'s output, looking through reshapes and casts."""
    function = tf.function(lambda f: forward(f, training=False))
    output = function.get_concrete_function(features).structured_outputs
    op = getattr(output, "op", None)
    while op is not None and op.type in _SHAPE_ONLY and op.inputs:
        op = op.inputs[0].op
    return op.type if op is not None else None


def _batch_of(features):
    first = next(iter(features.values())) if isinstance(features, dict) else features
    return int(first.shape[0])


def _spec(value):
    return f"{list(value.shape)} {value.dtype.name}" if hasattr(value, "shape") else type(value).__name__
