"""``vgpuctl mig``: a GPU's MIG profiles, placements and instances, and
root's making and destroying of MIG devices (docs/mig.md).

What changes goes through the daemon when one runs (it refuses to take a
MIG device or a GPU from under a job, and places jobs on the new devices at
once); with none, straight through NVML, which refuses what processes use.
"""

from __future__ import annotations

from typing import Any

import click

from vgpuctl.errors import DaemonUnavailable

SOCKET_HELP = "The daemon's socket (default: $VGPU_SOCKET, else the system daemon's)."
REPLY_S = 120.0


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="The state as JSON.")
@click.pass_context
def mig(ctx: click.Context, as_json: bool) -> None:
    """Show each GPU's MIG mode, profiles (count, memory, SMs, where they
    may start) and instances, with the index vgpuctl gives each MIG device
    (`run --gpu` takes it). `create`, `destroy`, `enable` and `disable`
    change them (root)."""
    if ctx.invoked_subcommand is None:
        _show(as_json)


def _show(as_json: bool) -> None:
    from vgpuctl.core.output import json_text
    from vgpuctl.system import mig as m
    from vgpuctl.system.nvml import Nvml

    nvml = Nvml()
    try:
        states = m.layout(nvml.module)
        index = {g.uuid: g.index for g in nvml.devices()}
    finally:
        nvml.close()
    if as_json:
        out = [s.wire() for s in states]
        for s in out:
            for i in s["instances"]:
                for d in i["devices"]:
                    d["index"] = index.get(d["uuid"])
        click.echo(json_text({"gpus": out}), nl=False)
        return
    for s in states:
        for line in _gpu_lines(s, index):
            click.echo(line)


def _gpu_lines(s: Any, index: dict[str, int]) -> list[str]:
    """One GPU's MIG state as `vgpuctl mig` prints it (index: a MIG
    device's inventory index by its UUID)."""
    mode = ("not supported" if not s.supported else "on" if s.enabled else "off")
    if s.pending != s.enabled and s.supported:
        mode += f" ({'on' if s.pending else 'off'} pending)"
    out = [f"GPU {s.index}: {s.name} (UUID: {s.uuid})  MIG {mode}"]
    if not s.enabled:
        return out
    out.append(f"  {'PROFILE':<10} {'FREE':>4}/{'MAX':<3} {'MEMORY':>8} {'SMS':>4}  STARTS")
    for p in s.profiles:
        starts = ",".join(str(a) for a, _ in p.placements)
        out.append(f"  {p.name:<10} {p.free:>4}/{p.count:<3} "
                   f"{_size(p.memory):>8} {p.sms:>4}  {starts}")
    if not s.instances:
        out.append(f"  no GPU instances: `vgpuctl mig create {s.index} PROFILE[@START]` "
                   "makes one")
    for i in s.instances:
        for ci, uuid in i.devices or ((None, ""),):
            at = f"GPU {index[uuid]}" if uuid in index else "-"
            ci_text = f"CI {ci}" if ci is not None else "no CI"
            out.append(f"  {at:<7} {i.profile}@{i.start:<2} GI {i.gi:<2} {ci_text:<5} {uuid}")
    return out


def _size(n: int) -> str:
    from vgpuctl.core.sizes import format_size

    return format_size(n)


def _call(socket_path: str | None, **req: Any) -> dict[str, Any] | None:
    """The daemon's reply; None when no daemon answers."""
    from vgpuctl.client.connection import connect

    try:
        with connect(socket_path, timeout=REPLY_S) as cl:
            return cl.call("mig", **req)
    except DaemonUnavailable:
        return None


def _direct() -> Any:
    from vgpuctl.system.nvml import Nvml

    return Nvml()


def _physical_index(nvml: Any, spec: str) -> int:
    from vgpuctl.system import mig as m

    return m.physical(m.layout(nvml.module), spec).index


@mig.command()
@click.argument("gpu")
@click.argument("profiles", nargs=-1, required=True, metavar="PROFILE[@START]...")
@click.option("--socket", "socket_path", metavar="PATH", help=SOCKET_HELP)
def create(gpu: str, profiles: tuple[str, ...], socket_path: str | None) -> None:
    """Make a MIG device of each PROFILE (1g.10gb; @START places it:
    3g.40gb@4) on GPU (its index or UUID): a GPU instance with one compute
    instance of the whole of it. Root only."""
    for spec in profiles:
        reply = _call(socket_path, action="create", gpu=gpu, profile=spec)
        if reply is not None:
            inst, idx = reply["instance"], reply.get("gpu")
        else:
            from vgpuctl.system import mig as m

            nvml = _direct()
            try:
                made = m.create(nvml.module, _physical_index(nvml, gpu), spec)
                inst = made.wire()
                uuid = next((u for _, u in made.devices), "")
                idx = next((g.index for g in nvml.reread() if g.uuid == uuid), None)
            finally:
                nvml.close()
        uuid = next((d["uuid"] for d in inst["devices"]), "")
        click.echo(f"GPU {idx}: MIG {inst['profile']}@{inst['start']} (GPU instance "
                   f"{inst['gi']}, UUID: {uuid})")


@mig.command()
@click.argument("devices", nargs=-1, required=True, metavar="DEVICE...")
@click.option("--socket", "socket_path", metavar="PATH", help=SOCKET_HELP)
def destroy(devices: tuple[str, ...], socket_path: str | None) -> None:
    """Destroy MIG devices (each its index or MIG- UUID), their GPU
    instance with them. Refused while a job is on one. Root only."""
    for dev in devices:
        reply = _call(socket_path, action="destroy", gpu=dev)
        if reply is None:
            from vgpuctl.system import mig as m

            nvml = _direct()
            try:
                d = m.mig_device(nvml.devices(), dev)
                m.destroy(nvml.module, d.parent, d.gi)
                reply = {"gpu": d.index, "uuid": d.uuid, "profile": d.mig, "parent": d.parent}
            finally:
                nvml.close()
        click.echo(f"GPU {reply['gpu']}: MIG {reply['profile']} on GPU {reply['parent']} "
                   f"destroyed ({reply['uuid']})")


def _mode(gpu: str, on: bool, socket_path: str | None) -> None:
    reply = _call(socket_path, action="enable" if on else "disable", gpu=gpu)
    if reply is None:
        from vgpuctl.system import mig as m

        nvml = _direct()
        try:
            idx = _physical_index(nvml, gpu)
            was = m.status(nvml.module, idx).enabled
            if was != on:
                m.set_mode(nvml.module, idx, on)
            reply = {"parent": idx, "changed": was != on}
        finally:
            nvml.close()
    word = "on" if on else "off"
    click.echo(f"GPU {reply['parent']}: MIG {word}" if reply.get("changed")
               else f"GPU {reply['parent']}: MIG was {word} already")


@mig.command()
@click.argument("gpu")
@click.option("--socket", "socket_path", metavar="PATH", help=SOCKET_HELP)
def enable(gpu: str, socket_path: str | None) -> None:
    """Turn MIG mode on on GPU (index or UUID): refused while jobs or
    processes use it. Root only."""
    _mode(gpu, True, socket_path)


@mig.command()
@click.argument("gpu")
@click.option("--socket", "socket_path", metavar="PATH", help=SOCKET_HELP)
def disable(gpu: str, socket_path: str | None) -> None:
    """Turn MIG mode off on GPU: refused while it has GPU instances. Root
    only."""
    _mode(gpu, False, socket_path)
