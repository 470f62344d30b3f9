"""The image, built once per session by docker/build.sh --yes (which installs podman, runc and
debootstrap with apt-get where no engine is present, and makes the base image where no
registry is reachable); later builds in the session come from the layer cache."""
import os
import time

import pytest
from container_engine import script


@pytest.fixture(scope="session")
def image():
    """The image ttf, up to date with this checkout (built, or taken from the layer cache)."""
    start = time.time()
    proc = script("build.sh", "--yes")
    assert proc.returncode == 0, proc.stdout[-5000:]
    print(f"\n[docker tests] docker/build.sh took {time.time() - start:.0f}s")
    return os.environ.get("TTF_IMAGE", "ttf")
