"""Writing files that others read."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from vgpuctl.errors import StateError


def write_output(path: Path | str, text: str, option: str = "--output") -> None:
    """Write text to the file a user named (``report -o PATH``), as a shell's
    ``>`` would, but never leaving a half-written file: a regular file (or
    none yet) is replaced atomically (write_atomic); anything else, a FIFO,
    a device such as /dev/null or /dev/stdout, is written through, never
    replaced. A symlink is followed, so the link stays and its target gets
    the text."""
    p = Path(path)
    target = Path(os.path.realpath(p))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise StateError(f"{option} {p}: {e.strerror}") from None
    if st is None or stat.S_ISREG(st.st_mode):
        write_atomic(target, text, option=option, shown=p)
        return
    if stat.S_ISDIR(st.st_mode):
        raise StateError(f"{option} {p}: is a directory")
    try:
        with open(target, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    except OSError as e:
        raise StateError(f"{option} {p}: {e.strerror}") from None


def write_atomic(path: Path | str, text: str, option: str = "--output",
                 shown: Path | str | None = None) -> None:
    """Write text to path so that readers see the old file or the new one,
    never a half-written one (temporary file in the same folder, fsync,
    rename). A file that existed keeps its mode (and, for root, its owner);
    a new one gets mode 0644 less the umask. ``shown``: the name errors
    give (default path)."""
    p = Path(path)
    name = p if shown is None else shown
    d = p.parent if str(p.parent) else Path(".")
    try:
        old: os.stat_result | None = os.stat(p)
    except OSError:
        old = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=d)
    except OSError as e:
        raise StateError(f"{option} {name}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if old is not None:
            os.chmod(tmp, stat.S_IMODE(old.st_mode))
            if os.geteuid() == 0:
                os.chown(tmp, old.st_uid, old.st_gid)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o644 & ~umask)
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StateError(f"{option} {name}: {e.strerror}") from None
