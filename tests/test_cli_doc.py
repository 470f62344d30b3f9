"""docs/cli.md is the commands' own help, current: a changed flag fails here until regenerated."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # a fresh process imports TensorFlow for `train.py -h` (8-20 s); CI's --all runs it once
def test_cli_doc_matches_the_commands_help():
    spec = importlib.util.spec_from_file_location("cli_doc", os.path.join(ROOT, "scripts", "cli_doc.py"))
    cli_doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli_doc)
    expected = cli_doc.render()  # runs `models/train.py -h` and `start_all.sh -h`
    assert "--tiacc" in expected and "--hvd" in expected  # both commands' help is in it
    current = open(os.path.join(ROOT, "docs", "cli.md")).read()
    assert current == expected, (
        "docs/cli.md differs from the commands' help (a flag or its help changed); regenerate it with "
        f"`{cli_doc.REGENERATE}` (the set-up's venv Python) and commit docs/cli.md")
