"""A job's life as one state machine (vgpuctl.daemon.jobs): each transition
from each state, by a table, against a real store: what it allows, what it
refuses (StateError, the record untouched), and what the store then holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpuctl.core.job import ENDED, RUNNING, STARTING, STATES, SUSPENDED, JobGpu, JobRecord
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.errors import StateError
from vgpuctl.store.database import Store

NOW = 1000.0


def live(tmp_path: Path, state: str) -> tuple[JobTable, Store, LiveJob]:
    store = Store.open(tmp_path / "db")
    table = JobTable(store, tmp_path / "jobs", lambda: NOW)
    rec = JobRecord(name="t", uid=1, user="u", command=["x"], cwd="/",
                    gpus=[{"index": 0, "uuid": "GPU-0"}], mem_limit=1, core_share=30,
                    policy="hard", created=0.0, state=state,
                    suspended_at=NOW - 5 if state == SUSPENDED else None)
    table.insert(rec)
    return table, store, table.add(rec, None)


# transition, the call, the states it may start from, the state it leaves,
# and what the store holds after it (field: value)
MOVES = [
    ("started", lambda t, j: t.started(j, 42, 7, alive=True), {STARTING}, RUNNING,
     {"root_pid": 42, "root_start": 7, "pids": {42: 7}, "started": NOW}),
    ("suspended", lambda t, j: t.suspended(j, "asked", NOW), {RUNNING}, SUSPENDED,
     {"suspend_reason": "asked", "suspended_at": NOW, "suspensions": 1}),
    ("resumed", lambda t, j: t.resumed(j, NOW), {SUSPENDED}, RUNNING,
     {"suspend_reason": None, "suspended_at": None, "suspended_s": 5.0}),
]


@pytest.mark.parametrize("move,do,allowed,after,stored",
                         MOVES, ids=[m[0] for m in MOVES])
@pytest.mark.parametrize("state", [s for s in STATES if s != ENDED])
def test_each_transition_from_each_state(tmp_path, move, do, allowed, after, stored, state):
    table, store, job = live(tmp_path, state)
    before = store.get_job(job.id)
    if state not in allowed:
        with pytest.raises(StateError, match=f"is {state}: it can't be {move}"):
            do(table, job)
        assert store.get_job(job.id) == before and job.rec.state == state
        return
    do(table, job)
    got = store.get_job(job.id)
    assert got.state == after == job.rec.state
    assert {k: getattr(got, k) for k in stored} == stored


def test_a_job_ends_from_any_state_and_is_no_longer_live(tmp_path):
    for state in (STARTING, RUNNING, SUSPENDED):
        table, store, job = live(tmp_path / state, state)
        table.end(job)
        assert store.get_job(job.id).state == ENDED and job.id not in table


def test_within_a_state_only_what_changed_is_written(tmp_path):
    """Processes seen, a launcher's exit, a flag, a move: each writes its own
    fields, and a scan that found what the record holds writes nothing."""
    table, store, job = live(tmp_path, RUNNING)
    table.processes_seen(job, {5: 9})
    table.launcher_exited(job, 3, None)
    table.flagged(job, "a counter went back")
    table.moved(job, [JobGpu(1, "GPU-1")])
    got = store.get_job(job.id)
    assert (got.pids, got.exit_code, got.region_error, got.gpus) == (
        {5: 9}, 3, "a counter went back", [JobGpu(1, "GPU-1")])
    assert got.state == RUNNING
    writes = []
    store.update_job = lambda rec, cols: writes.append(cols)
    table.processes_seen(job, {5: 9})
    assert writes == []
