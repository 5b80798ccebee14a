"""A job's processes through the driver's checkpoint API, all of them or
none: locked and checkpointed together (a failure undoes what was done),
restored together (a failure checkpoints the restored ones again), then
unlocked. Blocking calls: the suspender runs them on a worker thread.
"""

from __future__ import annotations

import logging

from vgpuctl.errors import CheckpointError
from vgpuctl.system.checkpoint import Driver

log = logging.getLogger("vgpuctl.daemon")


def checkpoint_all(driver: Driver, pids: list[int], timeout_ms: int, job_id: str) -> list[int]:
    """Lock, then checkpoint, every CUDA process among pids; returns them.
    On a failure, what was done is undone (restored, unlocked) and a
    CheckpointError says what failed and what could not be undone."""
    cuda = [p for p in pids if driver.state(p) is not None]
    if not cuda:
        raise CheckpointError(f"job {job_id} has no process using CUDA: nothing to suspend")
    locked: list[int] = []
    done: list[int] = []
    try:
        for p in cuda:
            driver.lock(p, timeout_ms)
            locked.append(p)
        for p in cuda:
            driver.checkpoint(p)
            done.append(p)
    except CheckpointError as e:
        stuck = _undo(driver, locked, done)
        why = str(e)
        if e.rc == 600:     # CUDA_ERROR_NOT_READY: the lock's timeout
            why += (f": its work did not finish within {timeout_ms / 1000:g} s "
                    "(suspend_lock_timeout_s)")
        msg = f"job {job_id} could not be suspended: {why}"
        raise CheckpointError(msg + (f"; {stuck}" if stuck else "; it keeps running"),
                              e.rc) from None
    return cuda


def _undo(driver: Driver, locked: list[int], done: list[int]) -> str:
    """Put processes back to running; what could not be, in words."""
    bad = []
    for p in done:
        try:
            driver.restore(p)
        except CheckpointError as e:
            bad.append(f"process {p} could not be restored ({e})")
    for p in locked:
        try:
            driver.unlock(p)
        except CheckpointError:
            st = _state(driver, p)
            if st not in (None, "running"):
                bad.append(f"process {p} is left {st} by the driver")
    return "; ".join(bad)


def _state(driver: Driver, pid: int) -> str | None:
    try:
        return driver.state(pid)
    except CheckpointError:
        return None


def checkpointed(driver: Driver, pids: list[int]) -> list[int]:
    """The processes among pids that the driver holds checkpointed."""
    return [p for p in pids if _state(driver, p) == "checkpointed"]


def restore_all(driver: Driver, pids: list[int], pairs: list[tuple[str, str]],
                 job_id: str) -> None:
    """Restore every process (they are then locked); on a failure the ones
    restored are checkpointed again and the job stays suspended."""
    restored: list[int] = []
    try:
        for p in pids:
            driver.restore(p, pairs)
            restored.append(p)
    except CheckpointError as e:
        bad = []
        for p in restored:
            try:
                driver.checkpoint(p)
            except CheckpointError as e2:
                bad.append(f"process {p} could not be checkpointed again ({e2})")
        msg = f"job {job_id} could not resume: {e}"
        raise CheckpointError(msg + ("; " + "; ".join(bad) if bad else
                                     "; it stays suspended"), e.rc) from None


def unlock_all(driver: Driver, pids: list[int], job_id: str) -> None:
    """Let every restored process run again; what could not be, logged."""
    bad = []
    for p in pids:
        try:
            driver.unlock(p)
        except CheckpointError as e:
            bad.append(str(e))
    if bad:
        log.error("job %s: resumed, but %s", job_id, "; ".join(bad))
