"""One module per command; COMMANDS is what vgpuctl.cli registers."""

from __future__ import annotations

import click

from .sim import sim

COMMANDS: list[click.Command] = [sim]

# The daemon and the command line (issue 4). Each module imports click only:
# the heavy parts (rich, pynvml, asyncio) load inside the command that needs them.
from .daemon import daemon  # noqa: E402
from .kill import kill  # noqa: E402
from .ps import ps  # noqa: E402
from .run import run  # noqa: E402
from .set import set_  # noqa: E402
from .status import status  # noqa: E402
from .top import top  # noqa: E402

COMMANDS += [run, status, ps, set_, kill, top, daemon]

# Operations (issue 6).
from .demo import demo  # noqa: E402
from .doctor import doctor  # noqa: E402
from .report import report  # noqa: E402

COMMANDS += [report, doctor, demo]
