"""``vgpuctl sim``: the simulated GPU."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from vgpuctl.errors import SimError, UsageError
from vgpuctl.system import native

if TYPE_CHECKING:
    from vgpuctl.system.simstate import DeviceShare, SimStats


@click.group()
def sim() -> None:
    """The simulated GPU (for machines with no GPU; `vgpuctl help simulator`).

    Its state is the file VGPU_SIM_STATE names (default
    /dev/shm/vgpu-sim-<uid>), shared by every process that uses it.
    """


@sim.command()
def libdir() -> None:
    """Print the folder holding the simulated libcuda.so.1 and libnvidia-ml.so.1.

    Any program runs on the simulated GPU with
    LD_LIBRARY_PATH=$(vgpuctl sim libdir).
    """
    click.echo(str(native.sim_libdir()))


def _state():  # type: ignore[no-untyped-def]
    from vgpuctl.system.simstate import SimState

    return SimState()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


@sim.command()
@click.option("--json", "as_json", is_flag=True, help="Print the state as one JSON object.")
def stats(as_json: bool) -> None:
    """Show the simulated GPUs: memory per device, process and tag (used,
    peak) and kernel time (busy_ns, the simulator's own timeline)."""
    st = _state().stats()
    if st is None:
        raise SimError("no simulated GPU state yet (it is created when a program first uses "
                       "the simulated GPU)")
    if as_json:
        click.echo(json.dumps(st.to_json()))
        return
    for line in _stats_lines(st):
        click.echo(line)


# What a period's utilization names (VGPU_SIM_UTIL_PROCS).
_UTIL_PROCS = {"last": "one process a period (the last to run)",
               "busiest": "one process a period (the busiest)", "each": "each process",
               "none": "no process (per-process utilization not supported)"}


def _stats_lines(st: SimStats) -> Iterator[str]:
    """`sim stats` as text: the settings, an injected NVML fault, the GPUs,
    the processes' and tags' usage, the processes not running."""
    yield (f"state {st.path}: {st.count} GPU(s), sample period {st.sample_ms} ms, "
           f"idle periods {'skipped' if st.util_idle == 'skip' else 'averaged in'}, "
           f"time slice {st.timeslice_us} us, switch {st.switch_us} us, "
           f"utilization of {_UTIL_PROCS.get(st.util_procs, st.util_procs)}")
    if st.nvml_error_count:
        left = "until cleared" if st.nvml_error_count < 0 else f"{st.nvml_error_count} more"
        yield f"fault: NVML calls return {st.nvml_error} ({left})"
    yield (f"{'GPU':<4} {'UUID':<41} {'used':>11} {'total':>11} {'busy s':>9} "
           f"{'kernels':>9}  fail-allocs")
    for d in st.devices:
        yield (f"{d.index:<4} {d.uuid:<41} {_mib(d.used):>11} {_mib(d.total):>11} "
               f"{d.busy_ns / 1e9:>9.3f} {d.kernels:>9}  {d.fail_allocs}")
    for m in st.mig_devices:
        yield (f"{m.parent}/{m.gi:<2} {m.uuid or '(no compute instance)':<41} "
               f"{_mib(m.used):>11} {_mib(m.total):>11} {m.busy_ns / 1e9:>9.3f} "
               f"{m.kernels:>9}  MIG {m.profile} at slice {m.start}")
    yield from _usage_lines(st)
    yield from _checkpoint_lines(st)


def _usage_lines(st: SimStats) -> Iterator[str]:
    """A table of each process's and tag's use of each GPU it used; nothing
    when none did."""
    rows = _process_rows(st) + _tag_rows(st)
    if not rows:
        return
    yield (f"\n{'':<8} {'pid/name':<16} {'tag':<12} {'GPU':<4} {'used':>11} {'peak':>11} "
           f"{'busy s':>9}")
    for kind, who, tag, u in rows:
        yield (f"{kind:<8} {who:<16} {tag:<12} {u.index:<4} {_mib(u.used):>11} "
               f"{_mib(u.peak):>11} {u.busy_ns / 1e9:>9.3f}")


def _process_rows(st: SimStats) -> list[tuple[str, str, str, DeviceShare]]:
    """("process", its pid, its tag, its use of a GPU) for each GPU a
    process holds memory, a context or kernel time on, or held before its
    checkpoint."""
    return [("process", str(p.pid), p.tag or "-", u) for p in st.processes for u in p.devices
            if u.used or u.contexts or u.busy_ns or u.held]


def _tag_rows(st: SimStats) -> list[tuple[str, str, str, DeviceShare]]:
    """("tag", its name, "", its use of a GPU) for each GPU a tag used."""
    return [("tag", t.name, "", u) for t in st.tags for u in t.devices
            if u.used or u.peak or u.busy_ns]


def _checkpoint_lines(st: SimStats) -> Iterator[str]:
    """The state of each process not running (the checkpoint API's), and
    the device memory it holds in host memory."""
    for p in st.processes:
        if p.checkpoint != "running":
            held = sum(u.held for u in p.devices)
            yield (f"process {p.pid}: {p.checkpoint}"
                   + (f", {_mib(held)} of device memory in host memory" if held else ""))


@sim.command()
@click.option("--fail-allocs", type=int, metavar="N",
              help="Make the next N device allocations on the GPU fail "
                   "(CUDA_ERROR_OUT_OF_MEMORY), from any process.")
@click.option("--gpu", type=int, default=0, show_default=True, metavar="I",
              help="The GPU --fail-allocs applies to.")
@click.option("--nvml-error", metavar="CODE",
              help="Make NVML calls return this error (a name such as GPU_IS_LOST, or a number).")
@click.option("--count", type=int, default=1, show_default=True, metavar="N",
              help="How many NVML calls fail; -1: all of them until --clear.")
@click.option("--clear", is_flag=True, help="Remove every injected fault.")
def fault(fail_allocs: int | None, gpu: int, nvml_error: str | None, count: int,
          clear: bool) -> None:
    """Inject faults into the simulated GPU, for tests."""
    from vgpuctl.system.simstate import nvml_error_code

    if clear + (fail_allocs is not None) + (nvml_error is not None) != 1:
        raise UsageError("give one of --fail-allocs, --nvml-error or --clear")
    state = _state()
    if clear:
        state.clear_faults()
    elif fail_allocs is not None:
        state.fail_allocs(fail_allocs, gpu)
    elif nvml_error is not None:
        if count == 0 or count < -1:
            raise UsageError("--count needs a number >= 1, or -1 for every call")
        state.nvml_error(nvml_error_code(nvml_error), count)


@sim.command()
@click.option("--force", is_flag=True,
              help="Delete it even while processes use it (never under a daemon).")
def reset(force: bool) -> None:
    """Delete the simulated GPU's state: all memory and history go.

    Refused while a vgpuctl daemon reads the state (even with --force): it
    would go on reading the deleted file. Stop the daemon first.
    """
    live = _state().reset(force)
    if live:
        raise SimError(f"{live} live process(es) use the simulated GPU; "
                       "stop them or use --force")
