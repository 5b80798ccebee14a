"""Writing files that others read."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from vgpuctl.errors import StateError


def write_atomic(path: Path | str, text: str) -> None:
    """Write text to path so that readers see the old file or the new one,
    never a half-written one (temporary file in the same folder, fsync,
    rename). The file gets mode 0644 less the umask."""
    p = Path(path)
    d = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=d)
    except OSError as e:
        raise StateError(f"--output {p}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o644 & ~umask)
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StateError(f"--output {p}: {e.strerror}") from None
