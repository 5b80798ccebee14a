"""The one exception hierarchy, and what each error means as an exit status.

Every error a user can cause is a VgpuError. Library code raises these and
never prints; the CLI edge (vgpuctl.cli.main) is the one place one becomes
a line on stderr (``vgpuctl: error: ...``) and its exit status. Each status
means one thing (docs/cli.md, "Exit status"):

====  ==================  ====================================================
code  class               meaning
====  ==================  ====================================================
1     VgpuError           failed: an internal error, or a step that failed
2     UsageError          bad input on the command line or in a request
3     DaemonUnavailable   no daemon answers, and none could be started
4     NotFound            no such job or GPU
5     PermissionDenied    not allowed: not the job's owner, not root
6     AdmissionRefused    the job does not fit on any GPU
7     ProtocolError       a client and a daemon that don't understand each other
8     StateError          a state file or directory can't be used
9     MissingComponent    the compiled parts, NVML or an optional package missing
10    DaemonConflict      another daemon already serves that socket or state
78    ConfigError         a bad configuration file (EX_CONFIG)
====  ==================  ====================================================
"""

from __future__ import annotations


class VgpuError(Exception):
    """Base of every error vgpuctl reports to a user."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(VgpuError):
    """Bad input on the command line or in a request (exit 2, as click does)."""

    exit_code = 2


class SimError(UsageError):
    """The simulated GPU is misconfigured (bad VGPU_SIM, unreadable state)."""


class DaemonUnavailable(VgpuError):
    """No daemon answers and none could be started."""

    exit_code = 3


class NotFound(VgpuError):
    """No such job or GPU."""

    exit_code = 4


class PermissionDenied(VgpuError):
    """The caller may not do this (not the job's owner, not root)."""

    exit_code = 5


class AdmissionRefused(VgpuError):
    """The job does not fit on any GPU; the message names what each has left."""

    exit_code = 6


class AdmissionBusy(AdmissionRefused):
    """Not now: the user has too many jobs starting, or asks too fast. The
    request did nothing; `vgpuctl run` asks again a moment later."""


class ProtocolError(VgpuError):
    """A malformed or unexpected message on the daemon socket."""

    exit_code = 7


class RequestInvalid(ProtocolError):
    """A request the daemon can't understand (bad JSON, unknown op, wrong
    types, another version); answered with a "protocol" error reply."""


class StateError(VgpuError):
    """A state file or directory can't be used: the runtime or state
    directory, the database, a report's output file."""

    exit_code = 8


class MissingComponent(VgpuError):
    """Something vgpuctl needs is not on this machine."""

    exit_code = 9


class NativeMissing(MissingComponent):
    """The compiled parts of the package are not where they should be."""


class NvmlUnavailable(MissingComponent):
    """NVML can't be loaded or initialised (no driver, no simulated GPU)."""


class CheckpointUnavailable(MissingComponent):
    """The driver can't suspend or move jobs here: none, or one older than
    R570 (R580 for a move); the message names the version needed."""


class MetricsUnavailable(MissingComponent):
    """The Prometheus endpoint was asked for without prometheus-client."""


class DemoError(VgpuError):
    """A step of `vgpuctl demo` failed (the message says which)."""


class DaemonConflict(VgpuError):
    """Another daemon already serves this socket or this state directory."""

    exit_code = 10


class ConfigError(VgpuError):
    """A configuration file that can't be used: names the file, key and reason."""

    exit_code = 78  # EX_CONFIG


class CheckpointError(VgpuError):
    """A step of suspending, resuming or moving a job failed: the driver's
    checkpoint API refused (``rc``: its CUresult), or the job can't be
    suspended (managed or IPC memory). What was done is undone."""

    def __init__(self, message: str, rc: int | None = None) -> None:
        super().__init__(message)
        self.rc = rc
