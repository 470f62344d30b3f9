"""The examples in ttf.data's docstrings run as written (from the repository root)."""
import doctest
import os

import pytest

import ttf
from ttf.data import _drift, _reader, _schema, _synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("module", [ttf.data, _reader, _schema, _synthetic, _drift], ids=lambda m: m.__name__)
def test_docstring_examples(module, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
