"""This module is ttf.distribute.collectives.horovod; the name ttf.distribute.horovod stays because
users' scripts import it (docs/horovod.md); importing it imports horovod."""
import sys

from ttf.distribute.collectives import horovod as _module

sys.modules[__name__] = _module
