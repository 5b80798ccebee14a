"""Where the daemon listens and keeps its files.

Two kinds of daemon:

  system daemon (root, usually under systemd)
      socket   /run/vgpu/vgpud.sock
      runtime  /run/vgpu            job regions under jobs/<id>/
      state    /var/lib/vgpu        vgpu.db, vgpud.log
      config   /etc/vgpu/vgpu.toml
  user daemon (started by ``vgpuctl run`` when no daemon answers)
      runtime  $XDG_RUNTIME_DIR/vgpu, else /tmp/vgpu-<uid> (mode 0700, ours)
      socket   <runtime>/vgpud.sock
      state    $XDG_STATE_HOME/vgpu, else ~/.local/state/vgpu
      config   $XDG_CONFIG_HOME/vgpu/vgpu.toml, else ~/.config/vgpu/vgpu.toml

``VGPU_SOCKET``, ``VGPU_RUNTIME_DIR``, ``VGPU_STATE_DIR`` and ``VGPU_CONFIG``
override each; command-line options override those.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from vgpuctl.errors import StateError, UsageError

SYSTEM_RUNTIME_DIR = Path("/run/vgpu")
SYSTEM_SOCKET = SYSTEM_RUNTIME_DIR / "vgpud.sock"
SYSTEM_STATE_DIR = Path("/var/lib/vgpu")
SYSTEM_CONFIG = Path("/etc/vgpu/vgpu.toml")

# Where the systemd unit is installed (`vgpuctl help unit`, docs/operations.md).
SYSTEM_UNIT_FILES = tuple(Path(d) / "vgpud.service" for d in
                          ("/etc/systemd/system", "/run/systemd/system",
                           "/usr/lib/systemd/system", "/lib/systemd/system"))

SOCKET_NAME = "vgpud.sock"
DB_NAME = "vgpu.db"
LOG_NAME = "vgpud.log"
LOCK_NAME = "vgpud.lock"
JOBS_DIR = "jobs"


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def user_runtime_dir(env: Mapping[str, str] | None = None) -> Path:
    e = _env(env)
    xdg = e.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "vgpu"
    return Path(f"/tmp/vgpu-{os.getuid()}")


def user_state_dir(env: Mapping[str, str] | None = None) -> Path:
    e = _env(env)
    xdg = e.get("XDG_STATE_HOME")
    if xdg:
        return Path(xdg) / "vgpu"
    return Path(e.get("HOME") or os.path.expanduser("~")) / ".local" / "state" / "vgpu"


def user_config(env: Mapping[str, str] | None = None) -> Path:
    e = _env(env)
    xdg = e.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg else Path(e.get("HOME") or os.path.expanduser("~")) / ".config"
    return base / "vgpu" / "vgpu.toml"


def user_socket(env: Mapping[str, str] | None = None) -> Path:
    return user_runtime_dir(env) / SOCKET_NAME


def absolute(path: str | Path) -> Path:
    """path made absolute against the current directory, as given: a
    relative --socket names the same file for a daemon started elsewhere
    (the user daemon runs in /). UsageError for a relative path in a
    current directory that was deleted."""
    try:
        return Path(os.path.abspath(os.fspath(path)))
    except FileNotFoundError:
        raise UsageError(f"{os.fspath(path)}: a relative path, but the current directory "
                         "was deleted: give an absolute one") from None


def client_sockets(explicit: str | None = None,
                   env: Mapping[str, str] | None = None) -> list[Path]:
    """The sockets a client tries, in order: --socket, else $VGPU_SOCKET, else
    the system socket then the user socket."""
    if explicit:
        return [absolute(explicit)]
    e = _env(env)
    if e.get("VGPU_SOCKET"):
        return [absolute(e["VGPU_SOCKET"])]
    return [SYSTEM_SOCKET, user_socket(env)]


def system_daemon_sign(markers: tuple[Path, ...] | None = None) -> Path | None:
    """A file that says this node has a system daemon: its config file, its
    installed unit, its runtime dir (kept across restarts), its socket. The
    first that exists, or None."""
    if markers is None:
        markers = (SYSTEM_SOCKET, SYSTEM_RUNTIME_DIR, SYSTEM_CONFIG, *SYSTEM_UNIT_FILES)
    for m in markers:
        if os.path.lexists(m):
            return m
    return None


def system_unit() -> Path | None:
    """The installed systemd unit of the system daemon, or None."""
    for u in SYSTEM_UNIT_FILES:
        if os.path.lexists(u):
            return u
    return None


def shared_socket(path: Path) -> bool:
    """Whether path is the socket of a daemon that serves every user (a
    system daemon's, mode 0666), as opposed to a private one (0600). Such a
    socket left behind means that daemon ran and may come back."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and bool(st.st_mode & 0o006)


class DaemonPaths(NamedTuple):
    socket: Path
    runtime_dir: Path
    state_dir: Path
    config: Path | None   # the config file; None: no file, defaults
    system: bool          # the system daemon's layout (dirs shared with other users)
    # config is the default location, read when it exists (at start and at
    # each reload: a file created later is picked up), defaults otherwise.
    config_optional: bool = False

    @property
    def jobs_dir(self) -> Path:
        return self.runtime_dir / JOBS_DIR

    @property
    def db(self) -> Path:
        return self.state_dir / DB_NAME

    @property
    def log(self) -> Path:
        return self.state_dir / LOG_NAME

    @property
    def lock(self) -> Path:
        return self.state_dir / LOCK_NAME


def default_config(user: bool, env: Mapping[str, str] | None = None) -> Path | None:
    """$VGPU_CONFIG, else the system or user config file when it exists."""
    p, optional = config_file(user, env)
    return None if optional and not p.exists() else p


def config_file(user: bool, env: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The config file a daemon reads: $VGPU_CONFIG (which must exist), else
    the system or user one (read when it exists); and whether it may be
    absent."""
    e = _env(env)
    if e.get("VGPU_CONFIG"):
        return absolute(e["VGPU_CONFIG"]), False
    return (user_config(env) if user else SYSTEM_CONFIG), True


def daemon_paths(user: bool, *, socket: str | None = None, runtime_dir: str | None = None,
                 state_dir: str | None = None, config: Path | None = None,
                 from_config: Mapping[str, str | None] | None = None,
                 env: Mapping[str, str] | None = None,
                 config_optional: bool = False) -> DaemonPaths:
    """Resolve the daemon's paths: command line, then environment, then the
    config file's keys, then the defaults of a system or user daemon. A
    runtime dir given without a socket holds the socket."""
    e = _env(env)
    cfg = from_config or {}

    def pick(cli: str | None, var: str, key: str) -> str | None:
        p = cli or e.get(var) or cfg.get(key) or None
        return str(absolute(p)) if p else None

    rt = pick(runtime_dir, "VGPU_RUNTIME_DIR", "runtime_dir")
    st = pick(state_dir, "VGPU_STATE_DIR", "state_dir")
    sock = pick(socket, "VGPU_SOCKET", "socket")
    runtime = Path(rt) if rt else (user_runtime_dir(env) if user else SYSTEM_RUNTIME_DIR)
    state = Path(st) if st else (user_state_dir(env) if user else SYSTEM_STATE_DIR)
    sockp = Path(sock) if sock else runtime / SOCKET_NAME
    return DaemonPaths(socket=sockp, runtime_dir=runtime, state_dir=state,
                       config=config, system=not user, config_optional=config_optional)


PRIVATE_DIR_VARS = "VGPU_RUNTIME_DIR, VGPU_STATE_DIR"


def ensure_private_dir(path: Path) -> None:
    """Create path (mode 0700), or check that an existing one is a directory
    of ours that nobody else could write to: /tmp/vgpu-<uid> could have been
    made by someone else, and whoever can write in a user daemon's dir can
    put a symlink where it creates its lock, database or socket. StateError
    (one line) when it is not; read access for others is taken away."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise StateError(f"{path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise StateError(f"{path} is a symbolic link: a user daemon's directory must be a "
                         f"directory of yours (or name another: {PRIVATE_DIR_VARS})")
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"{path}: not a directory")
    if st.st_uid != os.geteuid():
        raise StateError(f"{path} belongs to uid {st.st_uid}, not to you: remove it, or name "
                         f"another directory ({PRIVATE_DIR_VARS})")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise StateError(f"{path} is writable by others (mode {mode:04o}): a user daemon's "
                         f"directory must be yours alone; remove it (or `chmod 700` it if "
                         f"nobody could have put files in it), or name another "
                         f"({PRIVATE_DIR_VARS})")
    if mode & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError as e:
            raise StateError(f"{path}: {e.strerror}") from None


def ensure_shared_dir(path: Path) -> None:
    """Create path (mode 0755): the system daemon's runtime dir, readable by
    every job's user."""
    try:
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(path, 0o755)
    except OSError as e:
        raise StateError(f"{path}: {e.strerror}") from None


def report_db(env: Mapping[str, str] | None = None) -> Path:
    """The database ``vgpuctl report`` reads: $VGPU_STATE_DIR's, else the
    system daemon's when it exists, else the user daemon's."""

    e = os.environ if env is None else env
    if e.get("VGPU_STATE_DIR"):
        return Path(e["VGPU_STATE_DIR"]) / DB_NAME
    system = SYSTEM_STATE_DIR / DB_NAME
    try:
        if system.exists():
            return system
    except PermissionError:     # the state dir is the daemon's (0700): say so on open
        return system
    return user_state_dir(env) / DB_NAME
