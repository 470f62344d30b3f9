"""Moved: `python -m ttf.launch.server`. This name still runs it, with a DeprecationWarning,
because users' manifests start their servers with it."""
import sys

from ttf.launch._moved import warn_moved

warn_moved("ttf.distribute.server", "ttf.launch.server", __name__ == "__main__")

from ttf.launch.server import main  # noqa: E402  (after the warning: it loads TensorFlow, seconds)

if __name__ == "__main__":
    sys.exit(main())
