"""Byte sizes as users write them: 512M, 4G, 4GiB, 4Gi, 1.5G, 100B.

One grammar for all of vgpuctl and libvgpu (the hook's VGPU_MEM_LIMIT and the
simulator's VGPU_SIM parse the same way in C); both are tested against the
table in tests/data/sizes.json. The unit is required: a bare ``4`` is
refused rather than read as 4 bytes (``B`` is the unit for bytes). Units are
binary (K = 1024) and may be followed by ``i`` and ``B``; the number is
decimal, with an optional fraction but no sign or exponent; the result,
rounded down to whole bytes, is from 1 to 2^60. Exact integer arithmetic:
no float rounding.
"""

from __future__ import annotations

import re

MAX_SIZE = 1 << 60
_SCALE = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+)(?:\.([0-9]+))?\s*(?:([kmgtKMGT])([iI]?)([bB]?)|([bB]))\s*$",
                   re.ASCII)
_BARE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*$", re.ASCII)
_UNIT = re.compile(r"^\s*[0-9]+(?:\.[0-9]+)?\s*([A-Za-z]+)\s*$", re.ASCII)


def parse_size(text: str) -> int:
    """Bytes in ``text``. ValueError, with a message fit for one line, if bad."""
    m = _SIZE.match(str(text))
    if not m:
        bare = _BARE.match(str(text))
        if bare:
            n = bare.group(1)
            if not n.strip("0."):
                raise ValueError(f"{text!r} is not a positive size")
            hint = f"{n}G or {n}M" + ("" if "." in n else f" (or {n}B for bytes)")
            raise ValueError(f"{text!r} has no unit: write {hint}")
        u = _UNIT.match(str(text))
        if u:
            raise ValueError(f"{text!r}: unknown unit {u.group(1)!r} (use K, M, G or T)")
        raise ValueError(f"{text!r} is not a size (try 512M, 4G or 4GiB)")
    whole, frac, unit = m.group(1), m.group(2) or "", (m.group(3) or "").lower()
    scale = _SCALE[unit]
    value = int(whole) * scale + int(frac or "0") * scale // 10 ** len(frac)
    if value < 1:
        raise ValueError(f"{text!r} is not a positive size")
    if value > MAX_SIZE:
        raise ValueError(f"{text!r} is too large (at most 1048576T, 2^60 bytes)")
    return value


def format_size(n: int) -> str:
    """Short binary form: 4.0G, 512M, 300K, 12B."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"
