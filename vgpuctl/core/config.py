"""The daemon's configuration, checked: ``parse_config(data, source)`` turns
a parsed TOML table (every key in etc/vgpu.toml) into a ``Config``. An
unknown key or a bad value raises ConfigError naming the source, the key and
the reason. Sizes are strings with a unit ("512M", "8G", "100B"); the one
bare number allowed is 0, for ``reserve``. Reading
the file is vgpuctl.system.config_file's job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpuctl.core.enforcement import DEFAULT_ON_VIOLATION, ON_VIOLATION
from vgpuctl.core.sizes import parse_size
from vgpuctl.errors import ConfigError

POLICIES = ("hard", "soft")
PRIORITIES = ("low", "normal", "high")
LOG_LEVELS = ("debug", "info", "warning", "error")

DEFAULT_RESERVE = 512 << 20


# Caps on what one user may hold and ask for, besides the maxima of a job,
# for every user but root and the daemon's own user unless their table says
# otherwise: far above what anyone's work needs, and low enough that one
# user's flood of requests leaves the node to the others.
MAX_JOBS = 64               # live jobs (starting or running)
MAX_STARTING = 8            # jobs admitted whose command has not started yet
ADMISSION_RATE = 10.0       # admissions a second, in bursts of twice as many
MAX_TOTAL_SHARE = 0.9       # of the node's capacity, all of a user's jobs together


@dataclass(frozen=True)
class UserLimits:
    """What one user may ask for and hold; None = no maximum."""
    max_mem: int | None = None    # bytes: the largest --mem a job may ask for
    max_core: int | None = None   # percent: the largest --core
    max_total_mem: int | None = None  # bytes: the most all a user's live jobs may hold
    max_total_share: float | None = MAX_TOTAL_SHARE  # ...as a share of the node's capacity
    max_jobs: int | None = MAX_JOBS
    max_starting: int | None = MAX_STARTING
    admission_rate: float | None = ADMISSION_RATE   # per second

    @classmethod
    def none(cls) -> UserLimits:
        """No maximum at all (root's, unless it has a table of its own)."""
        return cls(None, None, None, None, None, None, None)


@dataclass(frozen=True)
class SlurmConfig:
    """The [slurm] table: how the daemon serves a Slurm node."""
    gpus: tuple[int, ...] | str = ()   # "all", or NVML indices: GPUs Slurm hands out
    allow_run: bool = False            # plain `vgpuctl run` on those GPUs too
    shard_size: int = 1 << 30          # bytes of memory per gres/shard
    reconcile_s: int = 60              # end jobs squeue no longer runs; 0: never

    def controls(self, index: int) -> bool:
        """Whether Slurm hands out GPU ``index`` (plain runs are refused there
        unless allow_run)."""
        return self.gpus == "all" or index in self.gpus


@dataclass(frozen=True)
class MigConfig:
    """The [mig] table: the MIG layout the daemon keeps (docs/mig.md): per
    GPU index, its GPU instances as PROFILE[@START]."""
    layout: tuple[tuple[int, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class PriorityConfig:
    """The [priority] table: classes (docs/compute.md, "Priority classes")."""
    default: str = "normal"            # the class of a job run without --priority
    high_users: tuple[str, ...] = ()   # who may run jobs of class high (root always)
    high_groups: tuple[str, ...] = ()  # ...and the members of these groups
    budget_us: int = 1000              # GPU time a lower class keeps in flight while
                                       # a higher one is active
    holdoff_ms: int = 100              # a job counts as active this long after it launched
    preempt: bool = True               # a normal or high job that fits only by taking low
                                       # jobs' memory suspends them (docs/suspend.md)
    preempt_min_run_s: int = 30        # a low job runs this long between preemptions


@dataclass(frozen=True)
class Config:
    source: str = "<defaults>"
    socket: str | None = None
    runtime_dir: str | None = None
    state_dir: str | None = None
    tick_ms: int = 100
    reserve: int = DEFAULT_RESERVE
    oversubscribe: float = 1.0
    core_oversubscribe: float = 1.0   # what the promised shares on a GPU may sum to, x 100 %
    promise_idle_s: int = 300         # an idle job's promised share yields to a job that
                                      # needs it after this long; 0: never
    default_policy: str = "hard"
    default_mem: int | None = None
    default_limits: UserLimits = field(default_factory=UserLimits)
    user_limits: Mapping[str, UserLimits] = field(default_factory=dict)
    metrics_address: str = ""
    log_level: str = "info"
    retention_days: int = 90
    start_timeout_s: int = 60     # a job not started by then gives its reservation back
    on_violation: str = DEFAULT_ON_VIOLATION   # report, protect, kill: core/enforcement.py
    # A user whose jobs were ended for violations cooldown_after times within
    # cooldown_s has new jobs held until cooldown_s after the last; 0: never.
    cooldown_s: int = 600
    cooldown_after: int = 2
    # Whether every user sees every job's command line and directory in
    # `ps`/`status` (else only its owner and root do).
    public_commands: bool = False
    # How long suspending a job waits for its work in flight before giving up
    # (the driver's lock timeout; docs/suspend.md).
    suspend_lock_timeout_s: int = 10
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    mig: MigConfig = field(default_factory=MigConfig)

    def limits_for(self, user: str, uid: int, admin: bool = False) -> UserLimits:
        """The maxima that apply to a user: their own table, else the
        default one; root (and, with ``admin``, the daemon's own user) has
        none unless it has its own table."""
        if user in self.user_limits:
            return self.user_limits[user]
        if str(uid) in self.user_limits:
            return self.user_limits[str(uid)]
        if uid == 0 or admin:
            return UserLimits.none()
        return self.default_limits


def _fail(source: str, key: str, reason: str) -> ConfigError:
    return ConfigError(f"{source}: {key}: {reason}")


def _str(source: str, key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise _fail(source, key, f"expected a string, got {v!r}")
    return v


def _path(source: str, key: str, v: Any) -> str | None:
    s = _str(source, key, v)
    if s and not s.startswith("/"):
        raise _fail(source, key, f"expected an absolute path, got {s!r}")
    return s or None


def _int(source: str, key: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(source, key, f"expected an integer, got {v!r}")
    if not lo <= v <= hi:
        raise _fail(source, key, f"must be {lo} to {hi}, got {v}")
    return v


def _size(source: str, key: str, v: Any, allow_zero: bool = False) -> int:
    if isinstance(v, bool):
        raise _fail(source, key, f"expected a size such as \"512M\", got {v!r}")
    if isinstance(v, int):
        # A bare number is refused, as on the command line (is 4 bytes or
        # 4 GiB meant?); zero needs no unit where it is allowed.
        if v == 0 and allow_zero:
            return 0
        raise _fail(source, key, f"expected a size with a unit such as \"{v}G\" or "
                                 f"\"{v}M\", got the bare number {v}")
    if isinstance(v, str):
        if allow_zero and v.strip() in ("0", "0B", "0b"):
            return 0
        try:
            return parse_size(v)
        except ValueError as e:
            raise _fail(source, key, str(e)) from None
    raise _fail(source, key, f"expected a size such as \"512M\", got {v!r}")


def _choice(source: str, key: str, v: Any, choices: tuple[str, ...]) -> str:
    s = _str(source, key, v).lower()
    if s not in choices:
        raise _fail(source, key, f"must be one of {', '.join(choices)}, got {v!r}")
    return s


def _address(source: str, key: str, v: Any) -> str:
    s = _str(source, key, v).strip()
    if not s:
        return ""
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise _fail(source, key, f"expected HOST:PORT such as \"127.0.0.1:9400\", got {v!r}")
    return s


def _ratio(source: str, key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(source, key, f"expected a number such as 1.5, got {v!r}")
    if not 1.0 <= float(v) <= 100.0:
        raise _fail(source, key, f"must be 1.0 (off) to 100, got {v}")
    return float(v)


def _or_none(parse: Callable[[str, str, Any], Any]) -> Callable[[str, str, Any], Any]:
    """A value, or "none" for no maximum."""
    def check(source: str, key: str, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "none":
            return None
        return parse(source, key, v)
    return check


def _total_mem(source: str, key: str, v: Any) -> tuple[int | None, float | None]:
    """max_total_mem: a size, or a percentage of the node's capacity."""
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            pct = float(v.strip()[:-1])
        except ValueError:
            pct = -1.0
        if not 0 < pct <= 100:
            raise _fail(source, key, f"expected a percentage from 1% to 100%, got {v!r}")
        return None, pct / 100
    return _size(source, key, v), None


def _rate(source: str, key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.01 <= v <= 10_000:
        raise _fail(source, key, f"expected a number of admissions a second from 0.01 to "
                                 f"10000, got {v!r}")
    return float(v)


_LIMIT_KEYS: dict[str, Callable[[str, str, Any], Any]] = {
    "max_mem": lambda s, k, v: _size(s, k, v),
    "max_core": lambda s, k, v: _int(s, k, v, 1, 100),
    "max_jobs": _or_none(lambda s, k, v: _int(s, k, v, 1, 1_000_000)),
    "max_starting": _or_none(lambda s, k, v: _int(s, k, v, 1, 1_000_000)),
    "admission_rate": _or_none(_rate),
}


def _user_limits(source: str, prefix: str, v: Any) -> UserLimits:
    """A limits table: each key it sets, the defaults for the others."""
    if not isinstance(v, dict):
        raise _fail(source, prefix, f"expected a table, got {v!r}")
    values: dict[str, Any] = {}
    for k, val in v.items():
        key = f"{prefix}.{k}"
        if k == "max_total_mem":
            values["max_total_mem"], values["max_total_share"] = \
                _or_none(_total_mem)(source, key, val) or (None, None)
        elif k in _LIMIT_KEYS:
            values[k] = _LIMIT_KEYS[k](source, key, val)
        else:
            raise _fail(source, key, "unknown key (known: "
                        + ", ".join(["max_total_mem", *_LIMIT_KEYS]) + ")")
    return UserLimits(**values)


def _slurm(source: str, v: Any) -> SlurmConfig:
    if not isinstance(v, dict):
        raise _fail(source, "slurm", f"expected a table, got {v!r}")
    values: dict[str, Any] = {}
    for k, val in v.items():
        key = f"slurm.{k}"
        if k == "gpus":
            if val == "all":
                values["gpus"] = "all"
            elif isinstance(val, list) and all(
                    isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1024
                    for i in val):
                values["gpus"] = tuple(sorted(set(val)))
            else:
                raise _fail(source, key, f'expected "all" or a list of GPU indices, got {val!r}')
        elif k == "allow_run":
            if not isinstance(val, bool):
                raise _fail(source, key, f"expected true or false, got {val!r}")
            values["allow_run"] = val
        elif k == "shard_size":
            values["shard_size"] = _size(source, key, val)
        elif k == "reconcile_s":
            values["reconcile_s"] = _int(source, key, val, 0, 86_400)
        else:
            raise _fail(source, key,
                        "unknown key (known: gpus, allow_run, shard_size, reconcile_s)")
    return SlurmConfig(**values)


def _mig(source: str, v: Any) -> MigConfig:
    if not isinstance(v, dict):
        raise _fail(source, "mig", f"expected a table, got {v!r}")
    layout: list[tuple[int, tuple[str, ...]]] = []
    for k, val in v.items():
        if k != "layout":
            raise _fail(source, f"mig.{k}", "unknown key (known: layout)")
        if not isinstance(val, dict):
            raise _fail(source, "mig.layout", "expected a table of GPU index = "
                        f"[\"PROFILE[@START]\", ...], got {val!r}")
        for gpu, specs in val.items():
            key = f"mig.layout.{gpu}"
            if not (gpu.isascii() and gpu.isdigit() and int(gpu) < 1024):
                raise _fail(source, key, "expected a GPU index such as 0")
            if not isinstance(specs, list) or not all(
                    isinstance(x, str) and _MIG_SPEC.fullmatch(x) for x in specs):
                raise _fail(source, key, "expected a list of GPU instances such as "
                            f"[\"1g.10gb\", \"3g.40gb@4\"], got {specs!r}")
            layout.append((int(gpu), tuple(specs)))
    return MigConfig(tuple(sorted(layout)))


_MIG_SPEC = re.compile(r"[0-9]+g\.[0-9]+gb(\+[a-z]+)?(@[0-9])?")


def _names(source: str, key: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise _fail(source, key, f"expected a list of names such as [\"alice\"], got {v!r}")
    return tuple(x.strip() for x in v)


def _priority(source: str, v: Any) -> PriorityConfig:
    if not isinstance(v, dict):
        raise _fail(source, "priority", f"expected a table, got {v!r}")
    keys: dict[str, Callable[[str, str, Any], Any]] = {
        "default": lambda s, k, x: _choice(s, k, x, PRIORITIES),
        "high_users": _names,
        "high_groups": _names,
        "budget_us": lambda s, k, x: _int(s, k, x, 50, 100_000),
        "holdoff_ms": lambda s, k, x: _int(s, k, x, 1, 10_000),
        "preempt": _bool,
        "preempt_min_run_s": lambda s, k, x: _int(s, k, x, 0, 86_400),
    }
    values: dict[str, Any] = {}
    for k, val in v.items():
        if k not in keys:
            raise _fail(source, f"priority.{k}", "unknown key (known: " + ", ".join(keys) + ")")
        values[k] = keys[k](source, f"priority.{k}", val)
    return PriorityConfig(**values)


_TOP: dict[str, Callable[[str, str, Any], tuple[str, Any]]] = {
    "socket": lambda s, k, v: ("socket", _path(s, k, v)),
    "runtime_dir": lambda s, k, v: ("runtime_dir", _path(s, k, v)),
    "state_dir": lambda s, k, v: ("state_dir", _path(s, k, v)),
    "tick_ms": lambda s, k, v: ("tick_ms", _int(s, k, v, 10, 10_000)),
    "reserve": lambda s, k, v: ("reserve", _size(s, k, v, allow_zero=True)),
    "oversubscribe": lambda s, k, v: ("oversubscribe", _ratio(s, k, v)),
    "core_oversubscribe": lambda s, k, v: ("core_oversubscribe", _ratio(s, k, v)),
    "promise_idle_s": lambda s, k, v: ("promise_idle_s", _int(s, k, v, 0, 30 * 86_400)),
    "default_policy": lambda s, k, v: ("default_policy", _choice(s, k, v, POLICIES)),
    "default_mem": lambda s, k, v: ("default_mem", _size(s, k, v)),
    "metrics_address": lambda s, k, v: ("metrics_address", _address(s, k, v)),
    "log_level": lambda s, k, v: ("log_level", _choice(s, k, v, LOG_LEVELS)),
    "retention_days": lambda s, k, v: ("retention_days", _int(s, k, v, 1, 36_500)),
    "start_timeout_s": lambda s, k, v: ("start_timeout_s", _int(s, k, v, 1, 86_400)),
    "on_violation": lambda s, k, v: ("on_violation", _choice(s, k, v, ON_VIOLATION)),
    "cooldown_s": lambda s, k, v: ("cooldown_s", _int(s, k, v, 0, 30 * 86_400)),
    "cooldown_after": lambda s, k, v: ("cooldown_after", _int(s, k, v, 1, 1000)),
    "public_commands": lambda s, k, v: ("public_commands", _bool(s, k, v)),
    "suspend_lock_timeout_s": lambda s, k, v: ("suspend_lock_timeout_s",
                                               _int(s, k, v, 1, 3600)),
}


def _bool(source: str, key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _fail(source, key, f"expected true or false, got {v!r}")
    return v


def parse_config(data: Mapping[str, Any], source: str = "<config>") -> Config:
    """A Config from a parsed TOML table; ConfigError on any unknown key or
    bad value."""
    values: dict[str, Any] = {"source": source}
    for key, v in data.items():
        if key in _TOP:
            name, val = _TOP[key](source, key, v)
            values[name] = val
        elif key == "limits":
            if not isinstance(v, dict):
                raise _fail(source, key, f"expected a table, got {v!r}")
            users: dict[str, UserLimits] = {}
            for lk, lv in v.items():
                if lk == "default":
                    values["default_limits"] = _user_limits(source, "limits.default", lv)
                elif lk == "users":
                    if not isinstance(lv, dict):
                        raise _fail(source, "limits.users", f"expected a table, got {lv!r}")
                    for user, ul in lv.items():
                        users[user] = _user_limits(source, f"limits.users.{user}", ul)
                else:
                    raise _fail(source, f"limits.{lk}", "unknown key (known: default, users)")
            values["user_limits"] = users
        elif key == "slurm":
            values["slurm"] = _slurm(source, v)
        elif key == "priority":
            values["priority"] = _priority(source, v)
        elif key == "mig":
            values["mig"] = _mig(source, v)
        else:
            raise _fail(source, key, "unknown key (known: "
                        + ", ".join([*_TOP, "limits", "slurm", "priority", "mig"]) + ")")
    return Config(**values)
