"""What model a checkpoint holds, so that a resume into another model is refused, not done.

A fingerprint lists, by their place in the checkpoint (the object path tf.train.Checkpoint
matches on), every ttf table (its layer class and row width) and every other variable of the
model (shape and dtype), plus the input schema when the job knows it. It is computed from
the Python objects alone (no tensor is read), saved inside every checkpoint as one string
variable, and compared before anything is restored: the first difference is one line.

A warm start (`warm_start`) is the deliberate way to begin a changed model from an old
checkpoint: tables by layer name and row width, other variables by name and shape, nothing
else (no optimizer state, step or input position).
"""
import json

import tensorflow as tf

from ttf.checkpoint._manager import CheckpointManager
from ttf.embedding._logical import LogicalTable

# Parts of a job's checkpoint that describe its progress, not its model: not compared (an
# optimizer's slots appear at its first step; a stream and a batch job of one model share a folder).
_NOT_MODEL = ("optimizer", "input_position", "stream_position", "train_step", "non_finite_guard", "precision",
              "auc_window", "event_ttl", "fingerprint")
_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
VARIABLE_KEY = "fingerprint" + _VALUE


class ModelFingerprint:
    """The model parts of a checkpoint object: `tables` {path: "Layer dim=D"}, `variables`
    {path: "[shape] dtype"}, `names` {path: the layer's or variable's own name} and `schema`;
    `objects` {path: the Python object} (not saved)."""

    def __init__(self, tables, variables, names, schema, objects=None):
        self.tables, self.variables, self.names, self.schema = tables, variables, names, schema
        self.objects = objects or {}

    @classmethod
    def of(cls, checkpoint, schema=None):
        """The fingerprint of the trackables under `checkpoint` (a tf.train.Checkpoint)."""
        tables, variables, names, objects = {}, {}, {}, {}
        view, seen = tf.train.TrackableView(checkpoint), set()

        def walk(obj, path):
            if id(obj) in seen:  # a shared object is saved once, at its first path
                return
            seen.add(id(obj))
            if isinstance(obj, LogicalTable):
                tables[path], names[path] = f"{type(obj.layer).__name__} dim={obj.layer.dim}", obj.layer.name
            elif _is_variable(obj):
                variables[path] = f"{list(obj.shape)} {tf.as_dtype(obj.dtype).name}"
                names[path] = getattr(obj, "path", None) or obj.name.split(":")[0]
            else:
                for name, child in view.children(obj).items():
                    walk(child, f"{path}/{name}")
                return
            objects[path] = obj

        for name, child in view.children(checkpoint).items():
            if name not in _NOT_MODEL:
                walk(child, name)
        text = None
        if schema is not None:
            text = f"{schema.name}[" + ",".join(f"{c.name}:{c.kind}" for c in schema.columns) + "]"
        return cls(tables, variables, names, text, objects)

    @classmethod
    def saved_in(cls, path):
        """The fingerprint checkpoint `path` holds; for one written before fingerprints, what
        its variable map shows (variables by path, tables by presence)."""
        reader = tf.train.load_checkpoint(path)
        if reader.has_tensor(VARIABLE_KEY):
            value = reader.get_tensor(VARIABLE_KEY)
            saved = json.loads(value.decode() if isinstance(value, bytes) else value)
            return cls(saved["tables"], saved["variables"], saved["names"], saved["schema"])
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
        variables, tables = {}, {}
        for key, shape in shapes.items():
            if key.split("/")[0] in _NOT_MODEL:
                continue
            if key.endswith(_VALUE):
                variables[key[: -len(_VALUE)]] = f"{list(shape)} {dtypes[key].name}"
            elif "/logical_table/" in key:
                tables[key.split("/logical_table/")[0] + "/logical_table"] = None  # present; width unknown
        return cls(tables, variables, {}, None)

    def to_json(self):
        return json.dumps({"tables": self.tables, "variables": self.variables, "names": self.names,
                           "schema": self.schema}, sort_keys=True)

    def variable(self):
        """A string variable holding this fingerprint, saved in the checkpoint as "fingerprint"."""
        return tf.Variable(self.to_json(), trainable=False, dtype=tf.string, name="ttf_model_fingerprint")

    def first_difference(self, saved):
        """None when this model may resume `saved`, else one phrase naming the first difference."""
        for part, what in (("tables", "ttf table"), ("variables", "variable")):
            old, new = getattr(saved, part), getattr(self, part)
            for path in sorted(set(old) | set(new)):
                name = saved.names.get(path) or self.names.get(path)
                where = f"{path} ({name})" if name else path
                if path not in new:
                    return f"the checkpoint has a {what} at {where} that this model does not have"
                if path not in old:
                    return f"this model has a {what} at {where} ({new[path]}) that the checkpoint does not have"
                if old[path] is not None and old[path] != new[path]:
                    return f"the {what} at {where} is {old[path]} in the checkpoint, {new[path]} in this model"
        if saved.schema and self.schema and saved.schema != self.schema:
            return f"the checkpoint was trained on the input schema {saved.schema}, this job reads {self.schema}"
        return None


def _is_variable(obj):
    return isinstance(obj, tf.Variable) or (hasattr(obj, "shape") and hasattr(obj, "dtype")
                                            and hasattr(obj, "assign") and not isinstance(obj, tf.Module))


def warm_start(current, saved, directory, log):
    """Loads into `current`'s objects the parts of the checkpoint chain in `directory` that
    match: tables with the same layer name and row width, other variables with the same name
    and shape (by path for a checkpoint written before fingerprints). Logs each part, then
    what it left at its initial values. Returns the number of parts loaded."""
    by_name = {name: path for path, name in saved.names.items()}
    matched = {}  # current path -> saved path
    for path in list(current.tables) + list(current.variables):
        source = by_name.get(current.names.get(path), path) if saved.names else path
        kind = "tables" if path in current.tables else "variables"
        old = getattr(saved, kind).get(source, "absent")
        if old is None or old == getattr(current, kind)[path]:
            matched[path] = source
    mirror = tf.train.Checkpoint(model=tf.Module())  # the matching objects at their saved paths
    for path, source in matched.items():
        node = mirror
        for part in source.split("/")[:-1]:
            if not hasattr(node, part):
                setattr(node, part, tf.Module())
            node = getattr(node, part)
        setattr(node, source.split("/")[-1], current.objects[path])
    CheckpointManager(mirror, directory).restore_latest()
    for path, source in matched.items():
        log(f"warm start: {current.names.get(path, path)} from {source}")
    left = sorted((set(current.tables) | set(current.variables)) - set(matched))
    if left:
        log(f"warm start: {len(left)} part(s) of this model left at their initial values: "
            + ", ".join(current.names.get(p, p) for p in left))
    return len(matched)
