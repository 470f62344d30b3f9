"""Moved: `python -m ttf.launch.hvdrun`. This name still runs it, with a DeprecationWarning, because
users' scripts start their hosts' ranks with it. It runs the new module by name (runpy),
so ttf.distribute never imports the launchers, which stand above it."""
import runpy
import warnings

warnings.warn("ttf.distribute.hvdrun is now ttf.launch.hvdrun: run `python -m ttf.launch.hvdrun` "
              "(the old name will go)", DeprecationWarning, stacklevel=1 if __name__ == "__main__" else 2)

if __name__ == "__main__":
    runpy.run_module("ttf.launch.hvdrun", run_name="__main__", alter_sys=True)
