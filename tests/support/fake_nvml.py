"""What the fake NVMLs of the compute tests share: pynvml's exception and
its process-utilization sample, with the fields the daemon reads."""

from __future__ import annotations

from dataclasses import dataclass

T0 = 1_700_000_000_000_000     # a sample timestamp, us


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Sample:
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int = 0
    encUtil: int = 0
    decUtil: int = 0
