"""Moved: `python -m ttf.launch.hvdrun`. This name still runs it, with a DeprecationWarning,
because users' scripts start their hosts' ranks with it."""
import sys

from ttf.launch._moved import warn_moved

warn_moved("ttf.distribute.hvdrun", "ttf.launch.hvdrun", __name__ == "__main__")

from ttf.launch.hvdrun import main  # noqa: E402  (after the warning: it imports horovod)

if __name__ == "__main__":
    sys.exit(main())
