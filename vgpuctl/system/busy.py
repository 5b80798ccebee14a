"""The device's busy time from NVML: ``nvmlDeviceGetSamples`` with
``NVML_GPU_UTILIZATION_SAMPLES``, the one utilization figure a real GPU gets
right whoever ran (an H100 read a 30 % duty process as 30.12 %, a 60 % one
as 60.15 %; docs/gpu-proof.md). Per-process figures are not read at all: an
H100 names one process a sample period when processes time-slice, and a MIG
instance has none (docs/compute.md).

Each sample is the device's utilization, in whole percents, over the sample
period that ends at its timestamp (microseconds of the wall clock). A read
asks for the samples newer than the newest it saw, and gives a `BusyWindow`: from
the previous window's end to the newest sample's timestamp, busy the samples'
utilization times the period (learnt as the shortest spacing of consecutive
timestamps), so windows tile the timeline. The first read of a GPU only sets
the starting point. NVML's errors give no window (logged at debug; a GPU that
has no such samples is said once at warning), and the daemon never dies of
one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

GPU_UTILIZATION_SAMPLES = 1      # NVML_GPU_UTILIZATION_SAMPLES
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_NOT_SUPPORTED = 3
# NVIDIA documents sample periods of 1/6 s to 1 s; until the spacing is seen
# a lone sample is taken to be this long.
DEFAULT_PERIOD_US = 166_667
MAX_PERIOD_US = 2_000_000


@dataclass(frozen=True)
class BusyWindow:
    """The device's busy time between two instants (seconds, wall clock)."""
    uuid: str
    start_s: float
    end_s: float
    busy_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class _Gpu:
    handle: Any = None
    last_us: int = 0          # the newest sample's timestamp seen
    period_us: int = 0        # learnt


class DeviceBusy:
    """Reads each GPU's busy time, one window a read."""

    def __init__(self, module: Any, handle_of: Callable[[str], Any] | None = None) -> None:
        self._nvml = module
        self._handle_of = handle_of or (
            lambda uuid: module.nvmlDeviceGetHandleByUUID(uuid.encode()))
        self._gpus: dict[str, _Gpu] = {}
        self._said: set[str] = set()

    def read(self, uuid: str) -> BusyWindow | None:
        g = self._gpus.setdefault(uuid, _Gpu())
        try:
            if g.handle is None:
                g.handle = self._handle_of(uuid)
            _, samples = self._nvml.nvmlDeviceGetSamples(g.handle, GPU_UTILIZATION_SAMPLES,
                                                         g.last_us)
        except Exception as e:  # noqa: BLE001 - NVML's errors give no window
            code = getattr(e, "value", None)
            if code == NVML_ERROR_NOT_SUPPORTED and uuid not in self._said:
                self._said.add(uuid)
                log.warning("nvmlDeviceGetSamples on %s: not supported; its busy time is "
                            "not checked against the jobs' own", uuid)
            elif code != NVML_ERROR_NOT_FOUND:
                log.debug("nvmlDeviceGetSamples on %s: %s", uuid, e)
                g.handle = None
            return None
        return self.take(uuid, [(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in samples])

    def take(self, uuid: str, samples: list[tuple[int, int]]) -> BusyWindow | None:
        """One read's samples (timestamp us, percent): the window they make."""
        g = self._gpus.setdefault(uuid, _Gpu())
        new = sorted((ts, min(max(v, 0), 100)) for ts, v in samples if ts > g.last_us)
        if not new:
            return None
        first = g.last_us == 0
        prev = g.last_us
        for (a, _), (b, _) in zip(new, new[1:], strict=False):
            if 0 < b - a <= MAX_PERIOD_US and (g.period_us == 0 or b - a < g.period_us):
                g.period_us = b - a
        if prev and 0 < new[0][0] - prev <= MAX_PERIOD_US and \
                (g.period_us == 0 or new[0][0] - prev < g.period_us):
            g.period_us = new[0][0] - prev
        g.last_us = new[-1][0]
        if first:
            return None
        period = g.period_us or DEFAULT_PERIOD_US
        busy_us = sum(v / 100 * period for _, v in new)
        start_us = max(prev, new[-1][0] - len(new) * period)
        return BusyWindow(uuid, start_us / 1e6, new[-1][0] / 1e6,
                      min(busy_us, new[-1][0] - start_us) / 1e6)
