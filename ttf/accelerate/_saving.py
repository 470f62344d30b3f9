"""A .keras file of an accelerated subclassed model: its class records the original class's
config, the ttf layers accelerate swapped in and where each went, and one example's input spec,
so that keras.models.load_model rebuilds it."""
import tensorflow as tf

from ttf.accelerate._paths import at, put, unlocked


def input_spec(sample):
    """Each input's dtype and shape after the batch dimension, as "dtype:d1,d2" (a config holds it)."""
    def spec(x):
        x = tf.convert_to_tensor(x)
        return f"{x.dtype.name}:{','.join(str(d) for d in x.shape[1:])}"
    return tf.nest.map_structure(spec, sample)


def _zeros_of(spec):
    """One example of zeros ("" for strings) of each input of an input_spec."""
    def zeros(leaf):
        dtype, dims = leaf.split(":")
        shape = [1] + [int(d) for d in dims.split(",") if d]
        return tf.fill(shape, "") if dtype == "string" else tf.zeros(shape, dtype)
    return tf.nest.map_structure(zeros, spec)


class _Accelerated:
    """Mixed into the class of an accelerated subclassed model (see _accelerated_class) so that a
    .keras file of it loads back: its config is the original class's config, the ttf layers
    accelerate swapped in with where each went (steps from the model), and one example's input
    spec; from_config makes the original class from its config, swaps the same layers in and
    calls the model on one example of zeros, which builds every layer (Keras' own build from the
    recorded shapes feeds floats, which string ids cannot take), and Keras then restores each
    variable by its usual path."""

    def get_config(self):
        if any(steps is None for steps in self._ttf_swaps):
            raise NotImplementedError(
                f"ttf.accelerate: {self.name} has a ttf table that no attribute, list or dict of the model leads "
                "to, so its config cannot say where it goes: save the weights (save_weights) instead")
        layers, swaps = {}, []  # id(layer) -> (index, layer): a layer held twice is saved once
        for steps in self._ttf_swaps:
            layer = at(self, steps)
            swaps.append([steps, layers.setdefault(id(layer), (len(layers), layer))[0]])
        accelerated = type(self)
        original = accelerated._ttf_original  # pylint: disable=no-member
        self.__class__ = original  # Keras checks whether the class wrote its own get_config: the user's class
        try:
            config = self.get_config()
        finally:
            self.__class__ = accelerated
        return {"model": {"module": original.__module__, "class_name": original.__name__,
                          "registered_name": tf.keras.utils.get_registered_name(original), "config": config},
                "layers": [tf.keras.utils.serialize_keras_object(layer) for _, layer in layers.values()],
                "swaps": swaps, "inputs": self._ttf_inputs}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        model = tf.keras.utils.deserialize_keras_object(config["model"], custom_objects=custom_objects)
        layers = [tf.keras.utils.deserialize_keras_object(layer, custom_objects=custom_objects)
                  for layer in config["layers"]]
        with unlocked(model):
            for steps, index in config["swaps"]:
                parent = at(model, steps[:-1])
                put(parent, *steps[-1], at(parent, steps[-1:]), layers[index])
        model(_zeros_of(config["inputs"]))
        record_swaps(model, [steps for steps, _ in config["swaps"]], config["inputs"])
        return model

    def build_from_config(self, config):
        if not self.built:  # from_config built it (tf_keras asks again)
            super().build_from_config(config)


tf.keras.utils.register_keras_serializable(package="ttf", name="AcceleratedModel")(_Accelerated)
_ACCELERATED_CLASSES = {}  # a user's model class -> its _Accelerated subclass


def _accelerated_class(cls):
    """cls's subclass of the same name with _Accelerated mixed in, registered under
    "ttf>AcceleratedModel": the name its .keras files carry, whichever class they hold (from_config
    reads the original class from the config, so any registered one loads any other's)."""
    if issubclass(cls, _Accelerated):
        return cls
    if cls not in _ACCELERATED_CLASSES:
        accelerated = type(cls.__name__, (_Accelerated, cls),
                           {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "_ttf_original": cls})
        _ACCELERATED_CLASSES[cls] = tf.keras.utils.register_keras_serializable(
            package="ttf", name="AcceleratedModel")(accelerated)
    return _ACCELERATED_CLASSES[cls]


def record_swaps(model, swaps, inputs):
    """Makes `model` an instance of its class's _Accelerated subclass that knows where its ttf
    layers went (swaps: their steps from model) and what one example of its inputs is."""
    model.__class__ = _accelerated_class(type(model))
    object.__setattr__(model, "_ttf_swaps", list(swaps))  # plain data, kept out of Keras' tracking
    object.__setattr__(model, "_ttf_inputs", inputs)
