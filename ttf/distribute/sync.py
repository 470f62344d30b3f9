"""This module is ttf.distribute.collectives.sync; the name ttf.distribute.sync stays because users'
scripts import it (docs/sync.md)."""
import sys

from ttf.distribute.collectives import sync as _module

sys.modules[__name__] = _module
