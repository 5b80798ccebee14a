"""The node's live state as tables and records: what `vgpuctl status`, `ps`,
`top` and `gpus` show, in every format, from the daemon's ``ps`` reply
(docs/cli.md lists its fields).

- Field names (``--fields``) are the reply's keys, so a field means the same
  in a table, in CSV and in JSON. ``JOB_FIELDS`` and ``GPU_FIELDS`` list them.
- Units (``--units``): ``human`` (``4G``), ``mib`` (a number of MiB, as
  ``nvidia-smi --format=csv,nounits``) or ``bytes``. CSV headers carry the
  unit in brackets (``mem_limit [MiB]``) as nvidia-smi's and `vgpuctl
  report`'s do; JSON always carries bytes, as the daemon sends them.
- The default tables (``job_table``, ``gpu_table``) keep a job's id, its
  GPU and its memory whole and give up width in a fixed order (``JOB_PLAN``,
  ``GPU_PLAN``; vgpuctl.core.layout): the command first, then the UUID's
  tail, the pids, the running time, the user, and the job's name last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from vgpuctl.core import output
from vgpuctl.core.job import GPU_FIELDS, JOB_FIELDS
from vgpuctl.core.layout import Cell, Column, Cut, Drop, Short, Step
from vgpuctl.core.output import (
    Field,
    command_text,
    short_command,
    short_uuids,
    size_text,
)
from vgpuctl.core.protocol import MAX_JOB_ID
from vgpuctl.errors import NotFound, UsageError

__all__ = ["GPU_FIELDS", "JOB_FIELDS", "Field"]   # the field tables, from the model

if TYPE_CHECKING:
    from datetime import tzinfo

# csv, datetime, fnmatch and shlex are imported where used: `ps --json`, which
# scripts call often, needs none of them.

FORMATS = ("table", "csv", "json")

Record = dict[str, Any]

# What CSV and JSON show when --fields is not given.
JOB_DEFAULT = ("id", "name", "user", "state", "pids", "gpu", "gpu_uuid", "mem_used",
               "mem_limit", "core", "core_measured", "policy", "priority", "runtime_s",
               "command")
GPU_DEFAULT = ("index", "uuid", "name", "memory_total", "memory_used", "utilization",
               "committed", "capacity", "core_promised", "core_capacity", "jobs", "drained")
LIST_FIELDS = ("index", "name", "uuid", "drained")        # `vgpuctl gpus`


def parse_fields(text: str | None, known: dict[str, Field], default: Sequence[str],
                 extra: Sequence[str] = ()) -> list[str]:
    """The field names of a --fields value (comma-separated, in order), or
    the default; an unknown name is a UsageError naming the valid ones.
    ``extra`` are names valid besides ``known`` (``timestamp``)."""
    if text is None:
        return list(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    valid = [*known, *extra]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        what = f"unknown field {bad[0]!r}" if bad else "no field given"
        raise UsageError(f"--fields: {what}; valid fields: {', '.join(valid)}")
    return names


def to_csv(records: Sequence[Record], names: Sequence[str], known: dict[str, Field],
           units: str, header_row: bool = True, extra: Record | None = None,
           tz: tzinfo | None = None) -> str:
    """CSV of the records' fields. ``extra`` gives values for names that are
    not fields of a record (``timestamp``)."""
    fs = [known.get(n, Field(n)) for n in names]
    rows = [[(extra or {}).get(f.name, "") if f.name not in known
             else output.cell(r.get(f.name), f, units, tz) for f in fs] for r in records]
    return output.csv_text([output.header(f, units) for f in fs] if header_row else None, rows)


def select(records: Sequence[Record], names: Sequence[str] | None) -> list[Record]:
    """The records with only the named fields (all of them for None)."""
    if names is None:
        return [dict(r) for r in records]
    return [{n: r.get(n) for n in names} for r in records]


# -- filters -------------------------------------------------------------------
def match_name(name: str, pattern: str) -> bool:
    """A job's name against --name: the exact name, or a shell pattern
    (``train-*``) when it has ``*``, ``?`` or ``[``."""
    if any(c in pattern for c in "*?["):
        import fnmatch

        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern


def filter_jobs(jobs: Sequence[Record], *, user: str | None = None,
                gpu_uuid: str | None = None, name: str | None = None) -> list[Record]:
    """The jobs that match every filter given: user (a name or a numeric
    uid), the GPU (its UUID, already resolved), name (match_name)."""
    out = []
    for j in jobs:
        if user is not None and user != str(j.get("user")) and \
                not (user.isdigit() and str(j.get("uid")) == user):
            continue
        if gpu_uuid is not None and gpu_uuid not in (j.get("gpu_uuids")
                                                     or [j.get("gpu_uuid")]):
            continue
        if name is not None and not match_name(str(j.get("name", "")), name):
            continue
        out.append(j)
    return out


MAX_JOB_ARG = 64    # the longest job name (core.protocol.MAX_NAME)


def is_job_id(spec: str) -> bool:
    """Whether a JOB argument is a job id: ASCII digits, 1 to
    core.protocol.MAX_JOB_ID; leading zeros are allowed (``007`` is job 7,
    sent as ``7``: the daemon takes only the canonical form). Other digits
    (``٣``, ``³``) are not an id."""
    return (0 < len(spec) <= MAX_JOB_ARG and spec.isascii() and spec.isdigit()
            and 1 <= int(spec) <= MAX_JOB_ID)


def check_job_args(specs: Sequence[str]) -> None:
    """A UsageError for a JOB argument that can be neither an id nor a name:
    empty, too long, or all digits but not a job id (0, past the largest id,
    or digits other than ASCII's)."""
    for spec in specs:
        s = spec.strip()
        if not s or len(s) > MAX_JOB_ARG:
            raise UsageError(f"{spec!r} is not a job id or name (as `vgpuctl ps` shows)")
        if s.isdigit() and not is_job_id(s):
            raise UsageError(f"{spec!r} is not a job id (a number from 1 to {MAX_JOB_ID} "
                             "in ASCII digits, as `vgpuctl ps` shows)")


def resolve_jobs(jobs: Sequence[Record], specs: Sequence[str],
                 mine: Callable[[Record], bool]) -> list[tuple[str, list[str]]]:
    """What each JOB argument of `kill` or `set` names: an id (a number) is
    itself, whether or not such a job runs (the daemon answers for it); a
    name, or a shell pattern (match_name), stands for every running job
    of that name that ``mine`` says the caller may act on. Returns (spec,
    ids), each id in its canonical form; a name that matches none is
    NotFound, an argument that can be neither a UsageError."""
    check_job_args(specs)
    out = []
    for spec in specs:
        s = spec.strip()
        if is_job_id(s):
            out.append((s, [str(int(s))]))
            continue
        ids = [str(j["id"]) for j in jobs if match_name(str(j.get("name", "")), s) and mine(j)]
        if not ids:
            raise NotFound(f"no job of yours named {s!r} runs (see vgpuctl ps)")
        out.append((s, ids))
    return out


# -- the default tables --------------------------------------------------------
def _percent(part: Any, whole: Any) -> str:
    if not isinstance(part, int) or not whole:
        return ""
    return f" ({100 * part / whole:.0f}%)"


def _pair(a: Any, b: Any, units: str) -> str:
    return f"{size_text(a, units) or '-'} / {size_text(b, units) or '-'}"


def _unit_suffix(units: str) -> str:
    return {"mib": " [MiB]", "bytes": " [B]"}.get(units, "")


def duration(s: Any) -> str:
    if not isinstance(s, (int, float)):
        return "-"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _pids(pids: Sequence[int], most: int = 3) -> str:
    if not pids:
        return "-"
    shown = ",".join(str(p) for p in pids[:most])
    return shown + (f" +{len(pids) - most}" if len(pids) > most else "")


Table = tuple[list[Column], list[list[Cell]], list[Step]]

GPU_PLAN: list[Step] = [Short("uuid"), Cut("name", 12), Drop("jobs"), Drop("uuid"),
                        Drop("compute"), Cut("name", 6)]
JOB_PLAN: list[Step] = [Short("command"), Cut("command", 12), Short("pids"), Drop("pids"),
                        Drop("command"), Drop("time"), Cut("user", 6), Drop("user"),
                        Cut("name", 8)]


def gpu_table(gpus: Sequence[Record], units: str = "human") -> Table:
    cols = [Column("index", "GPU", right=True), Column("name", "Name"),
            Column("memory", "Memory used/total" + _unit_suffix(units), right=True),
            Column("util", "Util", right=True),
            Column("limits", "Limits/capacity" + _unit_suffix(units), right=True),
            Column("compute", "Core", right=True),
            Column("jobs", "Jobs", right=True), Column("uuid", "UUID")]
    shorts = short_uuids([str(g.get("uuid", "")) for g in gpus])
    rows = []
    for g in gpus:
        util = g.get("utilization")
        committed = g.get("committed")
        uuid = str(g.get("uuid", ""))
        rows.append([
            Cell(str(g.get("index", "-"))),
            Cell(str(g.get("name", "")) + _on_parent(g)
                 + (" (drained)" if g.get("drained") else ""),
                 style="yellow" if g.get("drained") else ""),
            Cell(_pair(g.get("memory_used"), g.get("memory_total"), units)
                 + _percent(g.get("memory_used"), g.get("memory_total"))),
            Cell("-" if util is None else f"{util}%"),
            Cell("-" if committed is None else _pair(committed, g.get("capacity"), units)),
            Cell(_promised(g)),
            Cell("-" if g.get("jobs") is None else str(g["jobs"])),
            Cell(uuid, short=shorts.get(uuid), style="dim"),
        ])
    return cols, rows, list(GPU_PLAN)


def _on_parent(g: Record) -> str:
    """A MIG device's GPU, after its name ("... MIG 1g.10gb on GPU 0")."""
    parent = g.get("parent")
    return f" on GPU {parent}" if isinstance(parent, int) else ""


def _promised(g: Record) -> str:
    """A GPU's promised compute against what promises may sum to."""
    promised, cap = g.get("core_promised"), g.get("core_capacity")
    if not isinstance(promised, int):
        return "-"
    return f"{promised}%" + (f" / {cap}%" if isinstance(cap, int) and cap != 100 else "")


def _core(j: Record) -> str:
    measured = j.get("core_measured")
    text = f"{j.get('core', '-')}% / " + ("-" if not isinstance(measured, (int, float))
                                          else f"{100 * measured:.0f}%")
    text += " soft" if j.get("policy") == "soft" else ""
    return text + (f" {j['priority']}" if j.get("priority") in ("low", "high") else "")


def _gpus(j: Record) -> str:
    """A job's GPUs: its indices, comma-separated (``0,1``)."""
    indices = j.get("gpus") or ([] if j.get("gpu") is None else [j["gpu"]])
    return ",".join(str(i) for i in indices) or "-"


def _limit(j: Record) -> Any:
    """What a job's memory is held against in the table: its limits on all
    its GPUs (its memory used is all its GPUs' too)."""
    total = j.get("mem_limit_total")
    return total if isinstance(total, int) and total > 0 else j.get("mem_limit")


def _time(j: Record) -> str:
    state = j.get("state")
    if state == "starting":
        return "starting"
    text = duration(j.get("runtime_s"))
    if state == "suspended":
        return text + " suspended"
    if state == "ended":
        code, sig = j.get("exit_code"), j.get("exit_signal")
        text += " ended" + (f" sig {sig}" if sig else f" ({code})" if code is not None else "")
    return text


def job_table(jobs: Sequence[Record], units: str = "human") -> Table:
    cols = [Column("id", "Job", right=True), Column("name", "Name"), Column("user", "User"),
            Column("pids", "PIDs"), Column("gpu", "GPU", right=True),
            Column("mem", "Mem used/limit" + _unit_suffix(units), right=True),
            Column("core", "Core set/meas.", right=True), Column("time", "Time", right=True),
            Column("command", "Command")]
    rows = []
    for j in jobs:
        pids = j.get("pids") or []
        argv = j.get("command")
        rows.append([
            Cell(str(j.get("id", ""))), Cell(str(j.get("name", ""))),
            Cell(str(j.get("user", ""))),
            Cell(_pids(pids), short=_pids(pids, 1)),
            Cell(_gpus(j)),
            Cell(_pair(j.get("mem_used"), _limit(j), units),
                 style="bold red" if j.get("over_limit") else ""),
            Cell(_core(j)), Cell(_time(j)),
            Cell(command_text(argv), short=short_command(command_text(argv))),
        ])
    return cols, rows, list(JOB_PLAN)


def fields_table(records: Sequence[Record], names: Sequence[str], known: dict[str, Field],
                 units: str, extra: Record | None = None) -> Table:
    """A table of the named fields (--fields), headers as in CSV. In a
    narrow terminal UUIDs go short first, then the command is cut, then
    the name."""
    uuids = [str(r.get(n)) for r in records for n in names
             if n in ("uuid", "gpu_uuid") and r.get(n)]
    shorts = short_uuids(uuids)
    cols = []
    for n in names:
        kind = known[n].kind if n in known else "text"
        cols.append(Column(n, output.header(known.get(n, Field(n)), units),
                           right=kind in ("int", "bytes", "share", "seconds")))
    rows = []
    for r in records:
        row = []
        for n in names:
            if n not in known:
                row.append(Cell(str((extra or {}).get(n, ""))))
                continue
            text = output.cell(r.get(n), known[n], units)
            row.append(Cell(text, short=shorts.get(text)))
        rows.append(row)
    plan: list[Step] = [Short("uuid"), Short("gpu_uuid"), Cut("command", 16), Cut("cwd", 16),
                        Cut("name", 8)]
    return cols, rows, plan

