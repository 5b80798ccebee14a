"""Root's MIG requests (``vgpuctl mig``), and the layout the config keeps
(docs/mig.md).

The daemon makes and destroys MIG devices through its own NVML, refuses
what would take a GPU from under a job (destroying a MIG device a job is
on, turning MIG on or off on a GPU with jobs), and then reads the inventory
again, so that the new devices take jobs at once and the gone ones none.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from vgpuctl.core import protocol as P
from vgpuctl.core.config import MigConfig
from vgpuctl.errors import AdmissionRefused, PermissionDenied, StateError, UsageError
from vgpuctl.system import mig

if TYPE_CHECKING:
    from vgpuctl.daemon.requests import Peer
    from vgpuctl.daemon.supervisor import Supervisor

log = logging.getLogger("vgpuctl.daemon")


def _refuse_jobs(sup: Supervisor, uuids: set[str], what: str) -> None:
    on = sorted((j for j in sup.table if not j.rec.suspended
                 and uuids & set(j.uuids())), key=lambda j: int(j.id))
    if on:
        ids = ", ".join(j.id for j in on)
        raise AdmissionRefused(
            f"{what} has {len(on)} job{'s' if len(on) > 1 else ''} on it ({ids}): end, "
            "suspend or move them first (`vgpuctl drain` moves them)")


async def op_mig(sup: Supervisor, peer: Peer, req: P.Mig) -> dict[str, Any]:
    if not sup.is_admin(peer):
        raise PermissionDenied("only root may change MIG")
    nvml = sup.nvml
    if nvml is None:
        raise StateError("this daemon has no NVML to change MIG with")
    nv = nvml.module
    loop = asyncio.get_running_loop()

    def run(fn: Any, *args: Any) -> Any:
        return loop.run_in_executor(None, fn, *args)

    async with sup.suspender.lock:
        out: dict[str, Any] = {"action": req.action}
        if req.action == "destroy":
            d = mig.mig_device([sup.stats[g.uuid] for g in sup.gpus if g.uuid in sup.stats],
                               req.gpu)
            _refuse_jobs(sup, {d.uuid}, f"MIG device {d.index}")
            await run(mig.destroy, nv, d.parent, d.gi)
            out.update(gpu=d.index, uuid=d.uuid, parent=d.parent, profile=d.mig)
        else:
            states = await run(mig.layout, nv)
            parent = mig.physical(states, req.gpu)
            if req.action == "create":
                if not req.profile:
                    raise UsageError("mig create: which profile? (1g.10gb, 3g.40gb@4, ...)")
                inst = await run(mig.create, nv, parent.index, req.profile)
                out.update(parent=parent.index, instance=inst.wire())
            else:
                on = req.action == "enable"
                if on == parent.enabled:
                    out.update(parent=parent.index, changed=False)
                    return P.ok(**out)
                held = {g.uuid for g in sup.gpus
                        if g.index == parent.index and g.parent is None
                        or g.parent == parent.index}
                _refuse_jobs(sup, held, f"GPU {parent.index}")
                await run(mig.set_mode, nv, parent.index, on)
                out.update(parent=parent.index, changed=True)
        devices = await run(nvml.reread)
        sup.set_gpus(devices)
        sup.update_stats(await run(nvml.snapshot))
    sup.refresh_gpus()
    if req.action == "create":
        uuid = next((d["uuid"] for d in out["instance"]["devices"]), None)
        out["gpu"] = next((g.index for g in sup.gpus if g.uuid == uuid), None)
    log.info("mig %s %s%s by uid %d", req.action, req.gpu,
             f" {req.profile}" if req.profile else "", peer.uid)
    return P.ok(**out)


def keep_layout(nv: Any, cfg: MigConfig) -> list[str]:
    """Make what the config's [mig] layout has and the GPUs lack: MIG mode
    on, and each GPU instance (PROFILE@START where it is placed, PROFILE
    anywhere). Nothing is destroyed: an instance the layout lacks is kept
    (processes may use it) and said. Returns one line per thing done or
    refused, for the log."""
    said: list[str] = []
    for index, specs in cfg.layout:
        try:
            state = mig.status(nv, index)
        except Exception as e:      # noqa: BLE001 - a GPU that is not there
            said.append(f"mig layout: GPU {index}: {e}")
            continue
        try:
            if not state.enabled:
                mig.set_mode(nv, index, True)
                said.append(f"mig layout: GPU {index}: MIG mode on")
                state = mig.status(nv, index)
            left = list(state.instances)
            todo = []
            for spec in specs:
                name, start = mig.parse_spec(spec)
                hit = next((i for i in left if i.profile == name
                            and (start is None or i.start == start)), None)
                if hit is None:
                    todo.append(spec)
                else:
                    left.remove(hit)
            for spec in sorted(todo, key=lambda s: "@" not in s):   # placed ones first
                inst = mig.create(nv, index, spec)
                said.append(f"mig layout: GPU {index}: made {inst.profile}@{inst.start} "
                            f"(GPU instance {inst.gi})")
            for i in left:
                said.append(f"mig layout: GPU {index}: kept {i.profile}@{i.start} (GPU instance "
                            f"{i.gi}), which the layout lacks")
        except Exception as e:      # noqa: BLE001 - one line for the log, the rest goes on
            said.append(f"mig layout: GPU {index}: {e}")
    return said


def at_start(nvml: Any, cfg: MigConfig) -> list[Any]:
    """The GPUs the daemon starts with: the config's MIG layout made first
    (each step logged), then the inventory as it is, every MIG device that
    exists adopted."""
    if not cfg.layout:
        return list(nvml.devices())
    for line in keep_layout(nvml.module, cfg):
        log.info("%s", line)
    return list(nvml.reread())


def follow(sup: Supervisor, devices: list[Any]) -> str | None:
    """The GPUs as NVML lists them now (read again): when they differ from
    the daemon's (MIG devices made or destroyed outside vgpuctl, with
    nvidia-smi), the daemon's become these; returns what changed, or None."""
    before = {g.uuid: g.index for g in sup.gpus}
    now = {d.uuid: d.index for d in devices}
    if before == now:
        return None
    sup.set_gpus(devices)
    sup.refresh_gpus()
    gone = sorted(before[u] for u in set(before) - set(now))
    new = sorted(now[u] for u in set(now) - set(before))
    return (f"the GPUs changed outside vgpuctl (MIG devices made or destroyed): {len(now)} now"
            + (f", new {new}" if new else "") + (f", gone {gone}" if gone else ""))
