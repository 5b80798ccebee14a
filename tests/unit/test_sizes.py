"""The one size grammar (tests/data/sizes.json), as vgpuctl parses it; the
C side is checked against the same table in the native tests."""

from __future__ import annotations

import json

import pytest
from support import DATA

from vgpuctl.core.sizes import format_size, parse_size

CASES = json.loads((DATA / "sizes.json").read_text())["cases"]


@pytest.mark.parametrize(("text", "want"), CASES, ids=[repr(c[0]) for c in CASES])
def test_size_table(text, want):
    if want is None:
        with pytest.raises(ValueError) as e:
            parse_size(text)
        assert "\n" not in str(e.value)
    else:
        assert parse_size(text) == want


@pytest.mark.parametrize("n", [1, 100, 512 << 20, 4 << 30, 1536 << 20, 1 << 40])
def test_format_size_reads_back(n):
    assert parse_size(format_size(n)) == n
