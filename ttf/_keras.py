"""Which Keras tf.keras resolved to, and the functional-model internals ttf walks in it.

ttf works with either (tf_keras or Keras 3) and never switches it. The private internals of
each are in one place: tf_keras' in ttf/_functional_graph.py, Keras 3's in ttf/_keras3.py;
`graph` is this Keras' FunctionalGraph (ttf.accelerate and the synchronous table sharding
walk models through it).
What `import ttf` changes in stock Keras is ttf/_keras_hooks.py.
"""
import tensorflow as tf

KERAS3 = not tf.keras.Model.__module__.startswith("tf_keras.")  # which Keras tf.keras resolved to

if KERAS3:
    from ttf._keras3 import FunctionalGraph as graph  # noqa: E402  (imports keras: only where tf.keras is it)
else:
    from ttf._functional_graph import FunctionalGraph as graph  # noqa: E402
