"""ttf.accelerate: a user's Keras model with its Embedding layers turned into ttf tables.

By concern: which converter a model takes (_accelerate.py); the functional converter, which
also converts nested functional or Sequential blocks (_functional.py); the subclassed converter
(_subclassed.py), with Keras 3's copy of a model (_keras3_copy.py) and where a layer sits in a
model (_paths.py); what both do with an Embedding (_tables.py) and with compile (_compile.py);
the .keras files of accelerated subclassed models (_saving.py). The tables are
ttf.embedding.FusedLookup layers.
"""
from ttf.accelerate._accelerate import accelerate

__all__ = ["accelerate"]
