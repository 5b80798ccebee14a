"""``vgpuctl sim``: the simulated GPU."""

from __future__ import annotations

import click

from .. import native


@click.group()
def sim() -> None:
    """The simulated GPU (for machines with no GPU; see docs/simulator.md)."""


@sim.command()
def libdir() -> None:
    """Print the folder holding the simulated libcuda.so.1 and libnvidia-ml.so.1.

    Any program runs on the simulated GPU with
    LD_LIBRARY_PATH=$(vgpuctl sim libdir).
    """
    click.echo(str(native.sim_libdir()))
