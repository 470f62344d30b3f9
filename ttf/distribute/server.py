"""Moved: `python -m ttf.launch.server`. This name still runs it, with a DeprecationWarning, because
users' manifests start their servers with it. It runs the new module by name (runpy),
so ttf.distribute never imports the launchers, which stand above it."""
import runpy
import warnings

warnings.warn("ttf.distribute.server is now ttf.launch.server: run `python -m ttf.launch.server` "
              "(the old name will go)", DeprecationWarning, stacklevel=1 if __name__ == "__main__" else 2)

if __name__ == "__main__":
    runpy.run_module("ttf.launch.server", run_name="__main__", alter_sys=True)
