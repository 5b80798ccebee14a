"""Byte sizes as users write them: 512M, 4G, 4GiB, 1.5G, 1073741824."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in ``text``; units are binary (4G = 4 GiB). ValueError if bad."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size (try 512M, 4G or 4GiB)")
    unit = m.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(f"{text!r}: unknown unit {m.group(2)!r} (use K, M, G or T)")
    value = float(m.group(1)) * _UNITS[unit]
    if value < 1:
        raise ValueError(f"{text!r} is not a positive size")
    return int(value)


def format_size(n: int) -> str:
    """Short binary form: 4.0G, 512M, 300K, 12B."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"
