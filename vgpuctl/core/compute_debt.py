"""The compute budget's accounts (the rules that read them are
vgpuctl.core.violations'). Pure.

A scope (a job on a GPU, the sum of a user's jobs there, their work past
their hooks, the busy time no job claims) may use its share plus a margin
relative to it (`allowed`); what it uses beyond that in each of NVML's
windows accumulates as a debt (`Account`), which what it leaves unused pays
back down to zero. A debt past `BURST_S` GPU-seconds, or `BURST_UNGATED_S`
while it holds busy time that went through no gate, is over the budget.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# The compute budget: share + max(MARGIN x share, MARGIN_MIN) of the GPU,
# and BURST_S GPU-seconds above that, integrated.
MARGIN = 0.25
MARGIN_MIN = 0.05
BURST_S = 0.5
# ... or this, while the debt holds busy time that went through no gate.
BURST_UNGATED_S = 0.1
# A window's ungated busy time below this share of it is NVML's noise.
UNGATED_MIN = 0.01
# How far back a job's use is shown in a violation (its share of the GPU
# over about this long).
SHOWN_S = 2.0


def allowed(share: float) -> float:
    """The share of the GPU a share may use before it runs into debt."""
    return share + max(MARGIN * share, MARGIN_MIN)


@dataclass
class Account:
    """One scope's account on one GPU: its debt, and its recent windows
    (for the share a violation shows)."""
    debt: float = 0.0
    over: bool = False
    ungated: bool = False       # the debt holds busy time that went through no gate
    recent: deque[tuple[float, float, float]] = field(default_factory=deque)  # end, dt, busy

    def add(self, end: float, dt: float, busy: float, budget: float,
            ungated: float = 0.0) -> None:
        self.debt = max(self.debt + busy - budget * dt, 0.0)
        if self.debt <= 0.0:
            self.ungated = self.over = False
        elif ungated > UNGATED_MIN * dt:
            self.ungated = True
        if self.debt > self.burst:
            self.over = True
        self.recent.append((end, dt, busy))
        while self.recent and self.recent[0][0] < end - SHOWN_S:
            self.recent.popleft()

    @property
    def burst(self) -> float:
        return BURST_UNGATED_S if self.ungated else BURST_S

    def share(self) -> float:
        dt = sum(r[1] for r in self.recent)
        return min(sum(r[2] for r in self.recent) / dt, 1.0) if dt > 0 else 0.0


@dataclass
class UserSum:
    """A user's jobs on one GPU in one window, summed."""
    busy: float = 0.0
    share: float = 0.0
    free: float = 0.0       # through no gate
    past: float = 0.0       # past their hooks and own turns
    kept: float = 0.0       # of their own promises, used
    borrows: bool = False   # one of them may borrow

    def add(self, busy: float, share: float, free: float, past: float, kept: float,
            borrows: bool) -> None:
        self.busy += busy
        self.share += share
        self.free += free
        self.past += past
        self.kept += kept
        self.borrows = self.borrows or borrows
