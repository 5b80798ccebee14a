"""One output stack for every command that prints records: the node view
(`status`, `ps`, `top`, `gpus`: vgpuctl.core.nodeview) and usage reports
(vgpuctl.core.usage_report). A field has a name, a kind and maybe a unit; these
functions turn values into CSV cells and headers, CSV and JSON text, and
plain aligned tables, the same way for both.

- Units (``--units``, CSV): ``human`` (``4G``), ``mib`` (a number of MiB,
  as ``nvidia-smi --format=csv,nounits``) or ``bytes``. A CSV header carries
  its unit in brackets (``mem_limit [MiB]``, ``gpu_time [s]``), as
  nvidia-smi's do.
- CSV follows RFC 4180 with LF line ends; an unknown value (null) is an
  empty cell; lists are space-separated, a command is shell-quoted, times
  are ISO 8601 with the local offset.
- Nothing a job's user chose reaches a terminal as a control character: in
  CSV and plain tables every control character (C0, DEL, C1, U+2028/9) of
  a cell is written as an escape (``\x1b``, ``\n``), as in the daemon's log;
  the terminal tables show them as ``?`` (vgpuctl.core.layout); JSON
  escapes them itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from vgpuctl.core.protocol import escape_controls
from vgpuctl.core.sizes import format_size

if TYPE_CHECKING:
    from datetime import tzinfo

MIB = 1 << 20
UNITS = ("human", "mib", "bytes")
UUID_SHORT_HEX = 8      # GPU-d1d7f5c3: as many hex digits as a short UUID shows


class Field(NamedTuple):
    """An output field: its name (the JSON key, and the --fields name), the
    kind of its value, what it means, and for a number its unit and digits
    (CSV). ``header`` is its CSV name where that differs from ``name``."""
    name: str
    kind: str = "text"   # text, int, bytes, share, seconds, time, list (of numbers),
    #                      names (a list of strings), argv, bool, violations, per_gpu
    help: str = ""
    unit: str = ""       # the unit of a number that is not bytes ("s", "%", "GiB*h")
    digits: int | None = None
    header: str = ""


# Digits after the point, by kind, where a field does not say.
_DIGITS = {"seconds": 1, "number": 3}


def header(f: Field, units: str) -> str:
    """A field's CSV (and --fields table) header: its name, with its unit in
    brackets where the number has one."""
    name = f.header or f.name
    if f.kind == "bytes":
        return name + {"mib": " [MiB]", "bytes": " [B]"}.get(units, "")
    return f"{name} [{f.unit}]" if f.unit else name


def iso_time(t: float | None, tz: tzinfo | None = None) -> str:
    """Unix time t as local ISO 8601 with its offset (tz: for tests); ""
    for None."""
    if t is None:
        return ""
    from datetime import datetime

    dt = datetime.fromtimestamp(t, tz) if tz is not None else \
        datetime.fromtimestamp(t).astimezone()
    return dt.isoformat(timespec="seconds")


def size_text(n: Any, units: str) -> str:
    if not isinstance(n, int) or isinstance(n, bool):
        return ""
    if units == "bytes":
        return str(n)
    if units == "mib":
        return str(round(n / MIB))
    return format_size(n)


def command_text(argv: Any) -> str:
    """A command line, shell-quoted."""
    if isinstance(argv, list):
        import shlex

        return " ".join(shlex.quote(str(a)) for a in argv)
    return "" if argv is None else str(argv)


def short_command(text: str) -> str:
    """A command line with its program's folder left out: ``python3
    train.py`` for ``/opt/conda/bin/python3 train.py``."""
    program, sep, rest = text.partition(" ")
    return program.rsplit("/", 1)[-1] + sep + rest


def short_uuids(uuids: Sequence[str]) -> dict[str, str]:
    """Each UUID's short form: ``GPU-`` and its first 8 hex digits, more
    where two of them would share it (each short form is a unique prefix,
    usable as ``--gpu``)."""
    out = {}
    for u in uuids:
        n = len("GPU-") + UUID_SHORT_HEX if u.startswith("GPU-") else UUID_SHORT_HEX
        while n < len(u) and any(o != u and o.startswith(u[:n]) for o in uuids):
            n += 1
        out[u] = u[:n].rstrip("-")
    return out


def cell(v: Any, f: Field, units: str, tz: tzinfo | None = None) -> str:
    """A field's value as a CSV cell (and a --fields table's): empty for
    null, sizes in ``units``, lists space-separated, times as ISO 8601."""
    if v is None:
        return ""
    of_kind = _CELLS.get(f.kind)
    text = of_kind(v, units, tz) if of_kind is not None else None
    if text is not None:
        return text
    digits = f.digits if f.digits is not None else _DIGITS.get(f.kind)
    if digits is not None and _is_number(v):
        return f"{v:.{digits}f}"
    return str(v)


def _is_number(v: Any) -> bool:
    """An int or a float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _list_cell(v: Any, units: str, tz: tzinfo | None) -> str:
    return " ".join(str(x) for x in v) if isinstance(v, (list, tuple)) else str(v)


def _violations_cell(v: Any, units: str, tz: tzinfo | None) -> str | None:
    """kind:pid of each violation, newest last."""
    if not isinstance(v, list):
        return None
    return " ".join(f"{x.get('kind')}:{x.get('pid')}" for x in v if isinstance(x, dict))


def _per_gpu_cell(v: Any, units: str, tz: tzinfo | None) -> str | None:
    """index:used/limit:measured of each GPU."""
    if not isinstance(v, list):
        return None
    return " ".join(_gpu_cell(x, units) for x in v if isinstance(x, dict))


def _time_cell(v: Any, units: str, tz: tzinfo | None) -> str | None:
    return iso_time(v, tz) if isinstance(v, (int, float)) else None


def _share_cell(v: Any, units: str, tz: tzinfo | None) -> str | None:
    """A percent, as the share it is measured against."""
    return f"{100 * v:.1f}" if _is_number(v) else None


# A kind's cell, where it is not its value's text; None: the value is not of
# the kind's form, and is written as any other value.
_CELLS: dict[str, Callable[[Any, str, tzinfo | None], str | None]] = {
    "bytes": lambda v, units, tz: size_text(v, units),
    "bool": lambda v, units, tz: "true" if v else "false",
    "list": _list_cell,
    "names": _list_cell,
    "argv": lambda v, units, tz: command_text(v),
    "violations": _violations_cell,
    "per_gpu": _per_gpu_cell,
    "time": _time_cell,
    "share": _share_cell,
}


def _gpu_cell(g: dict[str, Any], units: str) -> str:
    """One GPU of a job's per_gpu: ``0:1.5G/2G:30%`` (its index, the memory
    it holds there over its limit, its measured share; ``-`` for unknown)."""
    meas = g.get("core_measured")
    share = f"{100 * meas:.0f}%" if isinstance(meas, (int, float)) else "-"
    return (f"{g.get('index')}:{size_text(g.get('mem_used'), units) or '-'}"
            f"/{size_text(g.get('mem_limit'), units) or '-'}:{share}")


def csv_text(head: Sequence[str] | None, rows: Iterable[Sequence[str]]) -> str:
    """CSV of the rows (cells already text), with a header row unless None."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if head is not None:
        w.writerow([escape_controls(str(h)) for h in head])
    for r in rows:
        w.writerow([escape_controls(str(c)) for c in r])
    return buf.getvalue()


def json_text(obj: Any, compact: bool = False, indent: int = 1) -> str:
    if compact:
        return json.dumps(obj, separators=(",", ":")) + "\n"
    return json.dumps(obj, indent=indent) + "\n"


def plain_table(head: Sequence[str], rows: Sequence[Sequence[str]],
                numeric: Sequence[bool]) -> str:
    """Aligned columns, no colour: for pipes, files and cron mail. Numbers
    right-aligned; nothing is cut."""
    cells = [[escape_controls(str(c)) for c in row] for row in [head, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = []
    for row in cells:
        parts = []
        for i, text in enumerate(row):
            if numeric[i]:
                parts.append(text.rjust(widths[i]))
            else:
                parts.append(text if i == len(row) - 1 else text.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"
