"""CLI of the synthetic generator: `python -m ttf.data.synthetic -h`.

The generator itself lives in ttf.data._synthetic (exported as ttf.data.SyntheticCriteo,
ttf.data.write_synthetic_criteo, ...). This module is only the command line, and the
package does not import it, so `python -m ttf.data.synthetic` runs it once, without
runpy's "found in sys.modules" warning.
"""
import sys

from ttf.data._synthetic import main

if __name__ == "__main__":
    sys.exit(main())
