"""The daemon's configuration file: ``load_config(path)`` reads the TOML file
and checks it with vgpuctl.core.config.parse_config.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from vgpuctl.core.config import Config, parse_config
from vgpuctl.errors import ConfigError


def _toml() -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    import tomli  # type: ignore[import-not-found]
    return tomli


def load_daemon_config(path: Path | None, optional: bool) -> Config:
    """A daemon's config: the file at path, or the defaults when there is
    none or it is optional and absent (the default location, before an
    operator creates it)."""
    if path is None or (optional and not Path(path).exists()):
        return Config()
    return load_config(path)


def load_config(path: Path | str | None) -> Config:
    """Read and check a config file; None gives the defaults."""
    if path is None:
        return Config()
    p = Path(path)
    toml = _toml()
    try:
        with open(p, "rb") as f:
            data = toml.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{p}: {e.strerror}") from None
    except toml.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    return parse_config(data, str(p))
