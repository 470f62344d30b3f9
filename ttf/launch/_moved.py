"""The launchers' old module names (ttf.distribute.server, ttf.distribute.hvdrun) stay runnable,
because users' manifests and scripts run them; each warns once, naming its new module."""
import warnings


def warn_moved(old, new, as_main):
    """Warns (DeprecationWarning) that module `old` is now `new`. as_main: `old` runs as
    `python -m old` (the warning is then attributed to __main__, which Python shows by default)."""
    warnings.warn(f"{old} is now {new}: run `python -m {new}` (the old name will go)", DeprecationWarning,
                  stacklevel=2 if as_main else 3)
