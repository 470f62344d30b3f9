"""This module is ttf.distribute.collectives._wire; the name ttf.distribute._wire stays because modules
written against the old layout import it."""
import sys

from ttf.distribute.collectives import _wire as _module

sys.modules[__name__] = _module
