"""Whose GPU time was it: NVML's busy time of one window, split among the
processes that ran, whatever NVML's own per-process split means.

NVIDIA's per-process utilization gives, per call, one entry per process;
what the entries of several processes that share the GPU mean is not
documented. Some drivers give each process its own busy time (the
simulator's ``VGPU_SIM_UTIL_PROCS=each``). An H100 with driver 580 names
**one process per sample period, with the whole device's utilization**,
and leaves the others out (docs/gpu-proof.md, "What the H100 returned"):
the sum of a window's entries is the device's busy time, the split is not
the processes'. Taken at face value, that reading gave a `--core 30` job 0
and its `--core 60` neighbour all of the GPU.

So the entries are used as they are only where they can't mislead:

- **per process**: once a one-period window of a GPU has listed two
  processes with busy time, its driver splits (no one-process-a-period
  driver ever does), and every entry is that process's own;
- **one job alone**: only one job launched in the window and nothing
  unhooked ran beside it: the device's busy time is that job's.

Otherwise the window's busy time B (the sum of its entries, the device's) is
split by what the jobs' hooks account (`split`):

1. each gated job *claims* its launches in the window times its cost per
   launch (the governor's estimate, GPU seconds a launch); a job whose cost
   is not known yet claims at the mean cost of the others, or all jobs alike
   per launch when none is known (where NVML named a process no gate
   accounts for beside such a job, its names are taken as they are);
2. the claims of certain cost first: above B they are scaled down to it,
   and the uncertain ones share what they leave; B above all the claims
   (the rest) goes first to what NVML named that no gate accounts for (a
   process without
   the hook, a job running ungated), then, beyond the noise of the cost
   estimates, to the processes on the GPU without the hook, then to the
   gated jobs: in proportion to what their gates allowed them and they did
   not claim (a job that under-reports its launches takes its own time
   back), and above all to the part of their claim whose cost is uncertain
   (a new job's cost is learnt from the rest, not its neighbours').

A cost is *certain* once learnt from windows whose busy time was the job's
own: it ran alone, or every other job's cost was certain and the rest (its
part) was at least RESIDUAL_OWN of the window's busy time; the governor
makes such windows where there are none (probes, docs/compute.md).

What a job's user can write (its launch counter) moves only its own share:
claiming more costs it, claiming less leaves the time where its gate says
it could have gone.

Pure: the governor (vgpuctl.governor.compute) supplies the claims and keeps
the costs; the violation watch splits its own windows the same way.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

# The rest (B above the claims) below this is the noise of cost estimates,
# not a process's: this share of the window, or of the claims.
NOISE_SHARE = 0.02
NOISE_CLAIMS = 0.05
# The rest goes to the gated jobs in proportion to: what their gates allowed
# beyond this part of it and they did not claim; this many times the part of
# their claim whose cost is uncertain; and this part of their claim.
SLACK = 0.9
UNCERTAIN_WEIGHT = 10.0
CERTAIN_WEIGHT = 0.02
# A cost this certain is taken as known: with every other job's this
# certain, the one left runs the rest as its own, where that is at least
# this share of the window's busy time (the others' small errors are a
# small part of it).
CERTAIN = 0.8
RESIDUAL_OWN = 0.25


@dataclass(frozen=True)
class Claim:
    """One job on the GPU over one window, as its hooks account it.

    launches   launches through its gate in the window; None: it runs
               ungated (the region does not count them)
    cost       estimated GPU seconds per launch; None: not known yet
    certainty  0..1: how much of the cost was learnt from windows whose busy
               time was the job's own (NVML's, not a split)
    allowed    launches its gate allowed in the window (None: no gate)
    """

    job_id: str
    pids: frozenset[int]
    launches: float | None
    cost: float | None = None
    certainty: float = 0.0
    allowed: float | None = None


@dataclass(frozen=True)
class Split:
    """Busy seconds per pid, and the jobs whose busy time is NVML's own
    figure for them (`own`, the windows a cost may be learnt from as
    certain)."""

    busy: dict[int, float]
    own: frozenset[str]
    split: bool            # the busy time was split by the claims
    off: float = 0.0       # how far the claims of known cost missed the device's
                           # busy time, a share of them, + under (split windows)


def split(busy: Mapping[int, float], duration: float, claims: Iterable[Claim],
          per_process: bool, hooked: Container[int] | None = None,
          unhooked: Iterable[int] = ()) -> Split:
    """NVML's window (busy seconds per pid listed, over duration seconds)
    split among the processes that ran (module docstring). hooked: the pids
    that loaded the hook (None: every job's pids); unhooked: pids on the GPU
    without it (they may have run unnamed)."""
    claims = [c for c in claims]
    busy = {p: max(0.0, float(b)) for p, b in busy.items()}
    owner = {p: c.job_id for c in claims for p in c.pids}
    if per_process:
        return Split(dict(busy), frozenset(c.job_id for c in claims), False)

    def is_hooked(pid: int) -> bool:
        return pid in owner and (hooked is None or pid in hooked)

    total = sum(busy.values())
    # (less than a launch in a window is the history's interpolation of one
    # made outside it)
    gated = [c for c in claims if c.launches is not None and c.launches >= 1.0]
    named_jobs = {owner[p] for p, b in busy.items() if p in owner}
    ungated = [c for c in claims if c.launches is None and c.job_id in named_jobs]
    free_named = {p: b for p, b in busy.items()
                  if not is_hooked(p) or owner[p] in {c.job_id for c in ungated}}
    candidates = [p for p in unhooked if p not in owner or not is_hooked(p)]
    # What may have run: jobs that launched through their gate, and jobs whose
    # launches no gate counted (named or not).
    active = {c.job_id for c in gated} | {c.job_id for c in claims if c.launches is None}
    # One job alone: nothing else launched, nothing else was named, nothing
    # unhooked on the GPU: the device's busy time is its own.
    if len(active) == 1 and not candidates and all(owner.get(p) in active for p in busy):
        (job,) = active
        return Split(dict(busy), frozenset({job}), False)
    if not gated or (free_named and any(c.cost is None for c in gated)):
        # No gate accounts for anything, or NVML named a process no gate
        # accounts for beside a job whose cost is not known yet: NVML's
        # names are all there is.
        return Split(dict(busy), frozenset(), False)

    known = [c.cost for c in gated if c.cost is not None and c.cost > 0]
    launches = sum(float(c.launches or 0.0) for c in gated)
    mean = (sum(known) / len(known) if known
            else (total / launches if launches > 0 else 0.0))
    claim = {c.job_id: float(c.launches or 0.0) * (c.cost if c.cost else mean) for c in gated}
    claimed = sum(claim.values())
    # Claims of known cost first; the uncertain ones share what is left.
    sure = {c.job_id for c in gated if c.cost is not None and c.certainty >= CERTAIN}
    sure_sum = sum(claim[j] for j in sure)
    unsure_sum = claimed - sure_sum
    out: dict[str, float] = {}
    if sure_sum >= total:
        scale = total / sure_sum if sure_sum > 0 else 0.0
        out = {j: (v * scale if j in sure else 0.0) for j, v in claim.items()}
        rest = 0.0
    elif claimed >= total:
        scale = (total - sure_sum) / unsure_sum if unsure_sum > 0 else 0.0
        out = {j: (v if j in sure else v * scale) for j, v in claim.items()}
        rest = 0.0
    else:
        out = dict(claim)
        rest = total - claimed
    extra: dict[int, float] = {}        # pid -> busy from the rest (no gate's)
    if rest > 0 and free_named:
        # NVML named what no gate accounts for: the rest is its.
        named_sum = sum(free_named.values())
        for p, b in free_named.items():
            share = b / named_sum if named_sum > 0 else 1.0 / len(free_named)
            extra[p] = extra.get(p, 0.0) + rest * share
        rest = 0.0
    noise = max(NOISE_SHARE * duration, NOISE_CLAIMS * claimed)
    if rest > noise and candidates:
        each = (rest - noise) / len(candidates)
        for p in candidates:
            extra[p] = extra.get(p, 0.0) + each
        rest = noise
    if rest > 0:
        # Up to the noise, in proportion to the claims, the uncertain ones
        # first; beyond it (a job's hidden launches) also to what the gates
        # allowed and was not claimed.
        small, large = min(rest, noise), max(0.0, rest - noise)
        for part, with_room in ((small, False), (large, True)):
            if part <= 0:
                continue
            weight = {}
            for c in gated:
                e = claim[c.job_id]
                room = 0.0
                if with_room and c.allowed is not None and c.launches is not None:
                    room = max(0.0, SLACK * c.allowed - c.launches) * (c.cost or mean)
                certain = min(max(c.certainty, 0.0), 1.0)
                weight[c.job_id] = room + (UNCERTAIN_WEIGHT * (1.0 - certain)
                                           + CERTAIN_WEIGHT) * e
            wsum = sum(weight.values())
            for j, w in weight.items():
                out[j] += part * (w / wsum if wsum > 0 else 1.0 / len(weight))
    own: frozenset[str] = frozenset()
    unsure = [c for c in gated if c.cost is None or c.certainty < CERTAIN]
    if (len(unsure) == 1 and not free_named and not candidates
            and not any(c.launches is None for c in claims)
            and total > 0 and out[unsure[0].job_id] >= RESIDUAL_OWN * total):
        own = frozenset({unsure[0].job_id})
    result: dict[int, float] = dict(extra)
    for c in gated:
        for p, b in _spread(out[c.job_id], c, busy, is_hooked).items():
            result[p] = result.get(p, 0.0) + b
    for p in busy:
        result.setdefault(p, 0.0)
    # How far the known costs missed: they claim more than the device ran,
    # or (nothing else to run it) less.
    off = 0.0
    if sure_sum > 0 and (sure_sum > total or (len(sure) == len(gated) and not extra)):
        off = (total - sum(extra.values()) - sure_sum) / sure_sum
    return Split(result, own, True, off)


def _spread(job_busy: float, c: Claim, named: Mapping[int, float], is_hooked) -> dict[int, float]:
    """A job's busy time over its pids: those NVML named that loaded the
    hook, as named; else one of its hooked pids; else one of its pids."""
    mine = {p: b for p, b in named.items() if p in c.pids and is_hooked(p)}
    s = sum(mine.values())
    if mine and s > 0:
        return {p: job_busy * b / s for p, b in mine.items()}
    hooked = sorted(p for p in c.pids if is_hooked(p))
    pick = hooked[0] if hooked else (min(c.pids) if c.pids else None)
    if pick is None:
        return {}
    return {pick: job_busy}
