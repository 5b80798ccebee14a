"""The violation rules (vgpuctl.core.violations), driven with figures: what
counts as a violation, which process is named, when one is new."""

from __future__ import annotations

from vgpuctl.core.violations import (
    COMPUTE,
    COMPUTE_SUSTAIN_S,
    MEMORY,
    NO_JOB,
    Checker,
    JobLimits,
)

G = 1 << 30
GPU = "GPU-0"


def lim(measured=None, share=0.1, mem=G, job="1"):
    return JobLimits(job, GPU, mem, share, measured)


def test_a_job_over_its_memory_names_its_largest_process_once():
    c = Checker()
    mem = {GPU: {10: G // 2, 11: G}}
    owner = {(GPU, 10): "1", (GPU, 11): "1"}
    found, new = c.check(0.0, [lim()], mem, {}, owner)
    assert [(v.kind, v.pid, v.job_id, v.value) for v in found] == [(MEMORY, 11, "1", 1.5 * G)]
    assert new == found
    found, new = c.check(0.1, [lim()], mem, {}, owner)
    assert found and new == []          # still there: not new
    # Back under, then over again: new again.
    c.check(0.2, [lim()], {GPU: {10: G // 2}}, {}, owner)
    assert c.check(0.3, [lim()], mem, {}, owner)[1]


def test_at_the_limit_is_no_violation_and_others_processes_do_not_count():
    c = Checker()
    mem = {GPU: {10: G, 20: 4 * G}}
    owner = {(GPU, 10): "1", (GPU, 20): "2"}
    found, _ = c.check(0.0, [lim(), lim(job="2", mem=8 * G)], mem, {}, owner)
    assert found == []


def test_a_process_in_no_job_is_named():
    found, _ = Checker().check(0.0, [], {GPU: {30: G}}, {}, {(GPU, 30): None})
    assert [(v.kind, v.pid, v.job_id) for v in found] == [(NO_JOB, 30, None)]


def test_compute_over_the_margin_counts_only_when_sustained():
    c = Checker()
    mem = {GPU: {10: G // 4, 11: G // 4}}
    owner = {(GPU, 10): "1", (GPU, 11): "1"}
    busy = {GPU: {10: 0.05, 11: 0.9}}
    t = 0.0
    while t < COMPUTE_SUSTAIN_S:
        assert c.check(t, [lim(0.95)], mem, busy, owner)[0] == []
        t += 0.1
    found, _ = c.check(t, [lim(0.95)], mem, busy, owner)
    assert [(v.kind, v.pid) for v in found] == [(COMPUTE, 11)]
    # One tick back within the margin starts the count again.
    c.check(t + 0.1, [lim(0.18)], mem, busy, owner)
    assert c.check(t + 0.2, [lim(0.95)], mem, busy, owner)[0] == []


def test_within_the_margin_is_no_compute_violation():
    c = Checker()
    mem = {GPU: {10: G // 4}}
    owner = {(GPU, 10): "1"}
    for i in range(40):     # 10 % share, 19 % measured: under 10 % + 10 points
        assert c.check(i * 0.1, [lim(0.19)], mem, {}, owner)[0] == []
    for i in range(40):     # 60 % share, 74 % measured: under 60 % + 25 %
        assert c.check(i * 0.1, [lim(0.74, share=0.6)], mem, {}, owner)[0] == []
