"""The region's structs and constants (libvgpu/include/vgpu/region.h),
through cffi from the very header the hook is compiled with, so the two
sides cannot drift."""

from __future__ import annotations

import re
from typing import Any

import cffi

from vgpuctl.system import native


def _cdef_source(text: str) -> str:
    """The header as cffi's cdef accepts it: comments and preprocessor lines
    dropped, except `#define NAME <integer>`."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            if re.match(r"#define\s+\w+\s+(0x[0-9a-fA-F]+|\d+)\s*$", s):
                out.append(s)
            continue
        out.append(line)
    return "\n".join(out)


_ffi: Any = None
_consts: dict[str, int] = {}


def ffi() -> Any:
    """The cffi instance that knows the region's structs."""
    global _ffi
    if _ffi is None:
        text = native.region_header().read_text()
        f = cffi.FFI()
        f.cdef(_cdef_source(text))
        for m in re.finditer(r"^#define\s+(VGPU_\w+)\s+(0x[0-9a-fA-F]+|\d+)\s*$", text, re.M):
            _consts[m.group(1)] = int(m.group(2), 0)
        _ffi = f
    return _ffi


def const(name: str) -> int:
    """An integer #define of region.h, by name."""
    ffi()
    return _consts[name]


def sizes() -> tuple[int, int, int]:
    """The sizes of the limits, usage and signal structs: the region's
    three segments."""
    f = ffi()
    return (f.sizeof("struct vgpu_limits"), f.sizeof("struct vgpu_usage"),
            f.sizeof("struct vgpu_signal"))
