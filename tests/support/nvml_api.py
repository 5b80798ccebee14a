"""The simulated NVML's table of entry points (libvgpu/sim/nvml/api.def) and
the lists of NVML names it is checked against (tests/data)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from support import DATA, REPO

API_DEF = REPO / "libvgpu" / "sim" / "nvml" / "api.def"

def api_table() -> dict[str, str]:
    """api.def as {name: where}: the file of nvml/ that defines it, or "stub"."""
    text = re.sub(r"/\*.*?\*/", "", API_DEF.read_text(), flags=re.S)
    rows = re.findall(r"^\s*NVML_API\(\s*(\w+)\s*,\s*(\w+)\s*\)", text, flags=re.M)
    table = dict(rows)
    assert len(table) == len(rows), "a name is listed twice in api.def"
    return table


def names_file(name: str) -> set[str]:
    """A list of names in tests/data: one a line, # comments."""
    lines = (DATA / name).read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def exported(library: Path) -> set[str]:
    """The functions a shared library exports (nm -D)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return {f[2] for f in (line.split() for line in out.splitlines())
            if len(f) == 3 and f[1] in "TtWi"}
