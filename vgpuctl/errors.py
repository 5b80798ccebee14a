"""The one exception hierarchy. Each error a user can cause is a VgpuError;
the CLI edge (vgpuctl.cli.main) turns it into one line on stderr and its exit
code. Library code raises these and never prints."""

from __future__ import annotations


class VgpuError(Exception):
    """Base of every error vgpuctl reports to a user."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self)


class UsageError(VgpuError):
    """Bad input on the command line or in a request (exit 2, as click does)."""

    exit_code = 2


class ConfigError(VgpuError):
    """A configuration file that can't be used: names the file, key and reason."""

    exit_code = 78  # EX_CONFIG


class NativeMissing(VgpuError):
    """The compiled parts of the package are not where they should be."""

    exit_code = 3


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


class ProtocolError(VgpuError):
    """A malformed or unexpected message on the daemon socket."""

    exit_code = 7


class SimError(VgpuError):
    """The simulated GPU is misconfigured (bad VGPU_SIM, unreadable state)."""

    exit_code = 2
