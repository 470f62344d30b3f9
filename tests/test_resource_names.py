"""One resource-naming scheme: every ttf resource (table, precision switch) gets its
shared_name from ttf._ops.unique_resource_name, unique across processes and hosts."""
import re
import subprocess
import sys

import ttf
from ttf._ops import unique_resource_name

_NAME = re.compile(r"(?P<prefix>.+)_[0-9a-f]{32}")

_PRINT_NAMES = """
import ttf
print(ttf.embedding.EmbeddingTable(4, name="t")._shared_name)
print(ttf.precision.PrecisionSwitch()._shared_name)
"""


def names_in_a_new_process():
    out = subprocess.run([sys.executable, "-c", _PRINT_NAMES], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def test_tables_and_switches_share_one_scheme_unique_across_processes():
    table = ttf.embedding.EmbeddingTable(4, name="t")
    switch = ttf.precision.PrecisionSwitch()
    assert _NAME.fullmatch(table._shared_name).group("prefix") == "t"
    assert _NAME.fullmatch(switch._shared_name).group("prefix") == "ttf_precision_switch"
    assert _NAME.fullmatch(unique_resource_name("x")) and unique_resource_name("x") != unique_resource_name("x")
    # Two processes (two chiefs connecting to one parameter server, say) never pick the
    # same name: a pid and a counter could repeat across hosts, a uuid does not.
    first, second = names_in_a_new_process(), names_in_a_new_process()
    assert len(set(first + second + [table._shared_name, switch._shared_name])) == 6
