"""The daemon's wire protocol: newline-delimited JSON over a Unix stream socket.

Each request is one line ``{"v": 1, "op": OP, ...fields}``; each reply one line
``{"v": 1, "ok": true, ...}`` or ``{"v": 1, "ok": false, "error": {"code":
CODE, "message": TEXT}}``. A line is at most MAX_LINE bytes. Requests are
checked here, at the edge, into typed records (NamedTuples: cheaper to
define than dataclasses, which matters to `vgpuctl run`'s start-up time);
anything else (bad JSON, JSON nested too deep, unknown op, wrong types,
another version, a job id not in its one form, a control character in a
name) is an errors.RequestInvalid, which the server answers with an error
reply. docs/daemon.md lists the ops.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from vgpuctl import errors

VERSION = 1
MAX_LINE = 1 << 20          # bytes, newline included
MAX_COMMAND_ARGS = 4096
MAX_NAME = 64
MAX_STORED_COMMAND = 4096   # characters of a job's command the daemon keeps
MAX_JOB_ID = (1 << 63) - 1  # SQLite's largest integer: a job id is 1 to this

# Characters that must not reach a log line or a terminal as they are: the
# C0 controls (newline, carriage return, escape...), DEL, the C1 controls
# and Unicode's line and paragraph separators. A name holding one is refused;
# free text (a command line, a directory) is escaped where it is written.
CONTROLS = frozenset([*map(chr, range(0x20)), *map(chr, range(0x7F, 0xA0)),
                      "\u2028", "\u2029"])
_ESCAPES = {ord(c): {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(
    c, f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}") for c in CONTROLS}

# error code <-> the exception a client raises for it
ERROR_CLASSES: dict[str, type[errors.VgpuError]] = {
    "usage": errors.UsageError,
    "not_found": errors.NotFound,
    "permission": errors.PermissionDenied,
    "admission": errors.AdmissionRefused,
    "protocol": errors.ProtocolError,
    "native_missing": errors.NativeMissing,
    "config": errors.ConfigError,
    "unavailable": errors.DaemonUnavailable,
    "state": errors.StateError,
    "missing": errors.MissingComponent,
    "conflict": errors.DaemonConflict,
    "checkpoint": errors.CheckpointError,
    "internal": errors.VgpuError,
}


def error_code(exc: errors.VgpuError) -> str:
    """The wire code of an exception (the most specific class that has one)."""
    for cls in type(exc).__mro__:
        for code, c in ERROR_CLASSES.items():
            if c is cls:
                return code
    return "internal"


# -- requests ----------------------------------------------------------------

class Ping(NamedTuple):
    pass


class Run(NamedTuple):
    command: list[str]
    cwd: str
    name: str | None = None
    mem: int | None = None        # bytes; None: the daemon's default_mem
    core: int | None = None       # percent 1..100; None: 100
    policy: str | None = None     # "hard" | "soft"; None: the daemon's default
    gpu: str | None = None        # GPUs by index, UUID or UUID prefix, "0,1"; None: placed
    gpus: int | None = None       # how many GPUs to place it on (not with gpu); None: 1
    priority: str | None = None   # "low" | "normal" | "high"; None: the daemon's default


class Started(NamedTuple):
    job: str
    pid: int


class Exited(NamedTuple):
    job: str
    code: int | None = None       # exit status 0..255
    signal: int | None = None     # or the signal that ended the command


class Ps(NamedTuple):
    all: bool = False             # ended jobs too
    job: str | None = None        # only this job


class Set(NamedTuple):
    job: str
    mem: int | None = None
    core: int | None = None
    policy: str | None = None
    priority: str | None = None


class Kill(NamedTuple):
    job: str
    signal: int = 15


class Reload(NamedTuple):
    pass


class Suspend(NamedTuple):
    """Suspend a job: its processes checkpointed, its GPU memory given back."""
    job: str


class Resume(NamedTuple):
    """Resume a suspended job, on the GPU named (a move) or where it fits."""
    job: str
    gpu: str | None = None


class Drain(NamedTuple):
    """Move every job off a GPU (root); undo: place jobs there again."""
    gpu: str
    undo: bool = False


class Mig(NamedTuple):
    """Root: make a MIG device (create: profile is PROFILE[@START] on GPU
    gpu), destroy one (gpu names the MIG device), or turn a GPU's MIG mode
    on or off (enable, disable)."""
    action: str
    gpu: str
    profile: str | None = None


MIG_ACTIONS = ("create", "destroy", "enable", "disable")


class Report(NamedTuple):
    """The accounting of [since, until): every job's for root, the caller's
    own for anyone else (`vgpuctl report` where the database is not theirs
    to read, as sacct shows a user their own jobs)."""
    since: float
    until: float


class SlurmRegister(NamedTuple):
    """Root's Prolog: fence a Slurm job's shards for its user (idempotent)."""
    slurm_job: str
    uid: int
    gpus: list[int]               # Slurm's indices of the GPUs the shards are on
    shards: int
    name: str | None = None
    partition: str | None = None
    account: str | None = None
    command: str | None = None
    cwd: str | None = None
    core: int | None = None       # None: shards / shards per GPU
    policy: str | None = None     # None: the daemon's default
    ask_core: int | None = None   # the job's own wish (--vgpu-core): at most the above
    priority: str | None = None   # the job's own wish (--vgpu-priority); None: the default
    gpu_shards: list[int] | None = None   # shards on each of gpus, same order (None:
                                          # unknown, which only one GPU's shards may be)


class SlurmAttach(NamedTuple):
    """A task of a Slurm job (its user, or root): the job's environment."""
    slurm_job: str
    pid: int | None = None        # the task's pid, to track


class SlurmRelease(NamedTuple):
    """Root's Epilog: end the Slurm job's vgpu job now."""
    slurm_job: str


Request = (Ping | Run | Started | Exited | Ps | Set | Kill | Reload | Suspend | Resume
           | Drain | Mig | Report | SlurmRegister | SlurmAttach | SlurmRelease)

# -- field checks -----------------------------------------------------------

Check = Callable[[str, Any], Any]


def escape_controls(text: str) -> str:
    """text with every character of CONTROLS written as an escape (``\\n``,
    ``\\x1b``, ``\\u2028``): one line, and nothing a terminal acts on."""
    return text.translate(_ESCAPES)


def is_job_id(text: str) -> bool:
    """Whether text is a job id as the daemon writes one: ASCII digits
    without a leading zero, 1 to MAX_JOB_ID (so "3" names job 3, and "03",
    "٣" or "+3" name nothing)."""
    return (0 < len(text) <= 19 and text.isascii() and text.isdigit()
            and text[0] != "0" and int(text) <= MAX_JOB_ID)


def _str(max_len: int = 4096, controls: bool = True) -> Check:
    """A string of at most max_len characters, never with a NUL; with
    controls=False, none of CONTROLS either (a name, which is logged and
    shown as it is)."""
    def check(name: str, v: Any) -> Any:
        if not isinstance(v, str):
            raise errors.RequestInvalid(f"{name}: expected a string")
        if len(v) > max_len:
            raise errors.RequestInvalid(f"{name}: longer than {max_len} characters")
        if "\0" in v:
            raise errors.RequestInvalid(f"{name}: contains a NUL character")
        if not controls and not CONTROLS.isdisjoint(v):
            bad = next(c for c in v if c in CONTROLS)
            raise errors.RequestInvalid(
                f"{name}: contains a control character ({escape_controls(bad)})")
        return v
    return check


def _int(lo: int, hi: int) -> Check:
    def check(name: str, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise errors.RequestInvalid(f"{name}: expected an integer")
        if not lo <= v <= hi:
            raise errors.RequestInvalid(f"{name}: must be {lo} to {hi}")
        return v
    return check


def _time(name: str, v: Any) -> Any:
    """Seconds since the epoch: a finite number from 0 to the year 5138."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1e11:
        raise errors.RequestInvalid(f"{name}: expected seconds since the epoch")
    return float(v)


def _bool(name: str, v: Any) -> Any:
    if not isinstance(v, bool):
        raise errors.RequestInvalid(f"{name}: expected true or false")
    return v


def _job(name: str, v: Any) -> Any:
    if not isinstance(v, str) or not is_job_id(v):
        raise errors.RequestInvalid(
            f"{name}: expected a job id such as \"12\" (ASCII digits, no leading zero, "
            f"at most {MAX_JOB_ID})")
    return v


def _policy(name: str, v: Any) -> Any:
    if v not in ("hard", "soft"):
        raise errors.RequestInvalid(f"{name}: must be \"hard\" or \"soft\"")
    return v


def _priority(name: str, v: Any) -> Any:
    if v not in ("low", "normal", "high"):
        raise errors.RequestInvalid(f"{name}: must be \"low\", \"normal\" or \"high\"")
    return v


def _mig_action(name: str, v: Any) -> Any:
    if v not in MIG_ACTIONS:
        raise errors.RequestInvalid(f"{name}: must be one of " + ", ".join(MIG_ACTIONS))
    return v


def _command(name: str, v: Any) -> Any:
    if not isinstance(v, list) or not v:
        raise errors.RequestInvalid(f"{name}: expected a non-empty list of strings")
    if len(v) > MAX_COMMAND_ARGS:
        raise errors.RequestInvalid(f"{name}: more than {MAX_COMMAND_ARGS} arguments")
    check = _str(65536)
    return [check(name, a) for a in v]


def _gpu_indices(name: str, v: Any) -> Any:
    if (not isinstance(v, list) or not 1 <= len(v) <= 64
            or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < 1024
                   for i in v)):
        raise errors.RequestInvalid(f"{name}: expected a list of 1 to 64 GPU indices")
    return v


def _shard_counts(name: str, v: Any) -> Any:
    if (not isinstance(v, list) or not 1 <= len(v) <= 64
            or any(isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= 1 << 20
                   for i in v)):
        raise errors.RequestInvalid(f"{name}: expected a list of 1 to 64 shard counts")
    return v


_MEM = _int(1, 1 << 60)
_CORE = _int(1, 100)
_NAME = _str(MAX_NAME, controls=False)

# op: (class, {field: (check, required)})
_OPS: dict[str, tuple[type, dict[str, tuple[Check, bool]]]] = {
    "ping": (Ping, {}),
    "run": (Run, {"command": (_command, True), "cwd": (_str(), True),
                  "name": (_NAME, False), "mem": (_MEM, False),
                  "core": (_CORE, False), "policy": (_policy, False),
                  "gpu": (_str(2048, controls=False), False),
                  "gpus": (_int(0, 1024), False),
                  "priority": (_priority, False)}),
    "started": (Started, {"job": (_job, True), "pid": (_int(1, 1 << 31), True)}),
    "exited": (Exited, {"job": (_job, True), "code": (_int(0, 255), False),
                        "signal": (_int(1, 128), False)}),
    "ps": (Ps, {"all": (_bool, False), "job": (_job, False)}),
    "set": (Set, {"job": (_job, True), "mem": (_MEM, False), "core": (_CORE, False),
                  "policy": (_policy, False), "priority": (_priority, False)}),
    "kill": (Kill, {"job": (_job, True), "signal": (_int(1, 64), False)}),
    "reload": (Reload, {}),
    "suspend": (Suspend, {"job": (_job, True)}),
    "resume": (Resume, {"job": (_job, True), "gpu": (_str(128, controls=False), False)}),
    "drain": (Drain, {"gpu": (_str(128, controls=False), True), "undo": (_bool, False)}),
    "report": (Report, {"since": (_time, True), "until": (_time, True)}),
    "mig": (Mig, {"action": (_mig_action, True), "gpu": (_str(128, controls=False), True),
                  "profile": (_str(32, controls=False), False)}),
    "slurm_register": (SlurmRegister, {
        "slurm_job": (_job, True), "uid": (_int(0, (1 << 32) - 2), True),
        "gpus": (_gpu_indices, True), "shards": (_int(1, 1 << 20), True),
        "name": (_NAME, False), "partition": (_NAME, False),
        "account": (_NAME, False), "command": (_str(), False),
        "cwd": (_str(), False), "core": (_CORE, False), "policy": (_policy, False),
        "ask_core": (_CORE, False), "priority": (_priority, False),
        "gpu_shards": (_shard_counts, False)}),
    "slurm_attach": (SlurmAttach, {"slurm_job": (_job, True),
                                   "pid": (_int(1, 1 << 31), False)}),
    "slurm_release": (SlurmRelease, {"slurm_job": (_job, True)}),
}

_OP_NAMES = {cls: op for op, (cls, _) in _OPS.items()}


def op_name(req: Request) -> str:
    """The op of a typed request ("ps" for a Ps)."""
    return _OP_NAMES[type(req)]


def parse_request(line: bytes | str) -> Request:
    """One request line into its typed request; errors.RequestInvalid otherwise."""
    try:
        obj = json.loads(line)
        return request_from(obj)
    except (ValueError, UnicodeDecodeError) as e:     # RequestInvalid is neither
        raise errors.RequestInvalid(f"not JSON: {e}") from None
    except RecursionError:
        # json's decoder recurses once per level: a line of 2,000 "[" is
        # not a request, and must not become a traceback.
        raise errors.RequestInvalid("not a request: JSON nested too deep") from None


def _shown(v: Any, limit: int = 40) -> str:
    """A client's value in an error reply: a short repr of a number, a
    string or null, the type of anything else."""
    if v is None or isinstance(v, (bool, int, float, str)):
        r = repr(v)
        return r if len(r) <= limit else r[:limit] + "…"
    return f"<a JSON {'object' if isinstance(v, dict) else 'array'}>"


def request_from(obj: Any) -> Request:
    if not isinstance(obj, dict):
        raise errors.RequestInvalid("a request is a JSON object")
    v = obj.get("v")
    if v != VERSION:
        raise errors.RequestInvalid(
            f"protocol version {_shown(v)} not supported (this daemon speaks {VERSION})")
    op = obj.get("op")
    if not isinstance(op, str) or op not in _OPS:
        raise errors.RequestInvalid(f"unknown op {_shown(op)} (known: {', '.join(_OPS)})")
    cls, fields = _OPS[op]
    kwargs: dict[str, Any] = {}
    for key, val in obj.items():
        if key in ("v", "op"):
            continue
        if key not in fields:
            raise errors.RequestInvalid(f"{op}: unknown field {_shown(key)}")
        if val is None and not fields[key][1]:
            continue
        kwargs[key] = fields[key][0](key, val)
    for key, (_, required) in fields.items():
        if required and key not in kwargs:
            raise errors.RequestInvalid(f"{op}: missing field {key!r}")
    req: Request = cls(**kwargs)
    return req


def stored_command(argv: list[str], limit: int = MAX_STORED_COMMAND) -> list[str]:
    """What the daemon keeps of a job's command (for ps, the database,
    reports): the arguments up to ``limit`` characters in all, the last one
    cut with "…", and a last element saying how many arguments were left out.
    The command itself runs in full (the client executes its own argv)."""
    if sum(len(a) for a in argv) <= limit:
        return list(argv)
    out: list[str] = []
    left = limit
    for i, a in enumerate(argv):
        if len(a) > left:
            out.append(a[:left] + "…")
            rest = len(argv) - i - 1
            if rest:
                out.append(f"…(+{rest} more arguments)")
            break
        out.append(a)
        left -= len(a)
    return out


def encode_request(op: str, **fields: Any) -> bytes:
    msg = {"v": VERSION, "op": op}
    msg.update({k: v for k, v in fields.items() if v is not None})
    return encode(msg)


# -- replies ----------------------------------------------------------------

def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def ok(**fields: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"v": VERSION, "ok": True}
    msg.update(fields)
    return msg


def error(code: str, message: str, retry: bool = False) -> dict[str, Any]:
    """An error reply. retry: the daemon did not read the request (a
    connection over a cap): the client may send it again on a new
    connection a moment later."""
    err: dict[str, Any] = {"code": code, "message": message}
    if retry:
        err["retry"] = True
    return {"v": VERSION, "ok": False, "error": err}


def may_retry(reply: Any) -> bool:
    """Whether an error reply says the request was not read (see error)."""
    return (isinstance(reply, dict) and isinstance(reply.get("error"), dict)
            and reply["error"].get("retry") is True)


def reply_exception(reply: Any) -> errors.VgpuError | None:
    """The exception an error reply stands for; None for a good reply.
    A reply that is not a protocol reply is a ProtocolError."""
    if not isinstance(reply, dict) or reply.get("v") != VERSION or "ok" not in reply:
        return errors.ProtocolError(f"the daemon sent an unexpected reply: {str(reply)[:200]}")
    if reply["ok"] is True:
        return None
    err = reply.get("error")
    if not isinstance(err, dict):
        return errors.ProtocolError("the daemon sent an error reply without an error")
    cls = ERROR_CLASSES.get(str(err.get("code")), errors.VgpuError)
    return cls(str(err.get("message", "unknown error")))
