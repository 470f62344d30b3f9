"""This module is ttf.distribute.collectives._tf; the name ttf.distribute._collectives stays because
modules written against the old layout import it."""
import sys

from ttf.distribute.collectives import _tf as _module

sys.modules[__name__] = _module
