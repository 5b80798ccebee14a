"""vgpuctl.core.attribution: a window's busy time split among the processes
that ran, where NVML names one process a sample period (an H100 with driver
580) and its entries are not the processes' own."""

from __future__ import annotations

import pytest

from vgpuctl.core.attribution import Claim, split

D = 0.2     # one sample period of an H100
A, B, X = frozenset({11}), frozenset({22}), frozenset({33, 34})


def gated(job: str, pids, launches: float, cost: float | None = 1e-3, certainty: float = 1.0,
          allowed: float | None = None) -> Claim:
    return Claim(job, pids, launches, cost, certainty,
                 allowed if allowed is not None else launches)


def test_where_nvml_splits_per_process_its_entries_stand():
    res = split({11: 0.06, 22: 0.12}, D, [gated("a", A, 60), gated("b", B, 120)],
                per_process=True)
    assert res.busy == {11: 0.06, 22: 0.12} and not res.split
    assert res.own == {"a", "b"}


def test_one_job_alone_has_the_devices_busy_time():
    res = split({11: 0.06}, D, [gated("a", A, 60, cost=None, certainty=0.0)],
                per_process=False)
    assert res.busy == {11: 0.06} and res.own == {"a"}


def test_one_named_process_with_the_devices_time_is_split_by_the_gates():
    """NVML names the 60 % job with the whole 90 %: the 30 % job ran a third
    of it, as its launches at its cost say."""
    claims = [gated("a", A, 60), gated("b", B, 120)]
    res = split({22: 0.18}, D, claims, per_process=False)
    assert res.split
    assert res.busy[11] == pytest.approx(0.06)
    assert res.busy[22] == pytest.approx(0.12)


def test_jobs_of_unknown_cost_started_together_split_by_launches():
    claims = [gated("a", A, 60, cost=None, certainty=0.0),
              gated("b", B, 120, cost=None, certainty=0.0)]
    res = split({11: 0.18}, D, claims, per_process=False)
    assert res.busy[11] == pytest.approx(0.06) and res.busy[22] == pytest.approx(0.12)


def test_a_new_job_gets_what_the_known_ones_did_not_run_as_its_own():
    """b's cost is not known (it would claim 120 x 1 ms): what the device ran
    beyond a's known 60 ms is b's, and b may learn from it."""
    claims = [gated("a", A, 60), gated("b", B, 120, cost=None, certainty=0.0)]
    res = split({11: 0.19}, D, claims, per_process=False)
    assert res.busy[11] == pytest.approx(0.06, abs=0.002)
    assert res.busy[22] == pytest.approx(0.13, abs=0.002)
    assert res.own == {"b"}


def test_a_small_rest_is_not_learnt_from():
    """What a's known 170 ms leave is 10 ms: a's error of a few percent would
    be a large part of it; b must run alone (a probe) to learn its cost."""
    claims = [gated("a", A, 170), gated("b", B, 10, cost=None, certainty=0.0)]
    res = split({11: 0.18}, D, claims, per_process=False)
    assert res.own == frozenset()


def test_a_job_whose_launches_no_gate_counted_may_have_run_unnamed():
    """b's gate was not yet counting (its launches unknown): a named alone
    is not alone, and its busy time is not its own."""
    claims = [gated("a", A, 60, cost=None, certainty=0.0), Claim("b", B, None)]
    res = split({11: 0.19}, D, claims, per_process=False)
    assert res.own == frozenset()


def test_what_nvml_named_that_no_gate_accounts_for_takes_the_rest():
    """An unhooked process of job x is named: beyond what the gated jobs
    claim, the device's time is its."""
    claims = [gated("a", A, 60), gated("x", X, 30)]
    res = split({34: 0.19}, D, claims, per_process=False, hooked={11, 33})
    assert res.busy[11] == pytest.approx(0.06)
    assert res.busy[33] == pytest.approx(0.03)
    assert res.busy[34] == pytest.approx(0.10)


def test_an_unhooked_process_on_the_gpu_takes_the_rest_unnamed():
    claims = [gated("a", A, 60), gated("x", X, 30)]
    res = split({11: 0.19}, D, claims, per_process=False, hooked={11, 33}, unhooked={34})
    assert res.busy[11] == pytest.approx(0.06, abs=0.005)
    assert res.busy[34] > 0.09


def test_the_noise_of_cost_estimates_is_not_an_unhooked_process():
    claims = [gated("a", A, 60), gated("b", B, 120)]
    res = split({11: 0.182}, D, claims, per_process=False, hooked={11, 22}, unhooked={99})
    assert res.busy.get(99, 0.0) == 0.0
    assert res.busy[11] + res.busy[22] == pytest.approx(0.182)


def test_a_job_that_under_reports_its_launches_keeps_its_own_time():
    """x's gate allowed it 120 launches and it says it made 12: the time it
    hid is its own, not its neighbour's."""
    claims = [gated("a", A, 60), gated("x", X, 12, allowed=120)]
    res = split({11: 0.18}, D, claims, per_process=False)
    assert res.busy[11] == pytest.approx(0.06, abs=0.005)
    assert res.busy[33] == pytest.approx(0.12, abs=0.005)


def test_claims_above_the_devices_time_are_scaled_down():
    claims = [gated("a", A, 60), gated("b", B, 120)]
    res = split({22: 0.09}, D, claims, per_process=False)
    assert res.busy[11] == pytest.approx(0.03) and res.busy[22] == pytest.approx(0.06)


def test_an_ungated_job_named_beside_a_new_one_keeps_nvmls_names():
    """Nothing is known of the gated newcomer's cost and a job no gate counts
    was named: NVML's entries are all there is."""
    claims = [Claim("s", A, None), gated("b", B, 5, cost=None, certainty=0.0)]
    res = split({11: 0.2, 22: 0.0}, D, claims, per_process=False)
    assert res.busy == {11: 0.2, 22: 0.0} and not res.split
