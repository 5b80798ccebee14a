"""The pure rules of suspend and resume (vgpuctl.core.suspend_rules): the UUID
pairs of a move, what can't be suspended, where a job resumes, and which
preemptible jobs make room."""

from __future__ import annotations

import pytest

from vgpuctl.core.suspend_rules import (
    FEATURE_IPC,
    FEATURE_MANAGED,
    Candidate,
    Room,
    gpu_pairs,
    resume_target,
    unsuspendable,
    victims,
)

G = 1 << 30
A, B, C, D = "GPU-a", "GPU-b", "GPU-c", "GPU-d"


def test_a_move_is_a_bijection_of_every_gpu():
    assert gpu_pairs([A, B, C], {}) == []
    assert gpu_pairs([A, B, C], {A: A}) == []
    # the job's GPU goes to its target, the target back, the others stay
    assert gpu_pairs([A, B, C], {A: B}) == [(A, B), (B, A), (C, C)]
    # two GPUs of a job moving along a chain: each lands somewhere once
    pairs = gpu_pairs([A, B, C, D], {A: B, B: C})
    assert dict(pairs) == {A: B, B: C, C: A, D: D}
    assert sorted(n for _, n in pairs) == [A, B, C, D]


def test_a_move_must_be_one_to_one_and_name_this_nodes_gpus():
    with pytest.raises(ValueError):
        gpu_pairs([A, B, C], {A: C, B: C})
    with pytest.raises(ValueError):
        gpu_pairs([A, B], {A: D})


def test_what_cant_be_suspended_is_named():
    assert unsuspendable({}) is None
    assert unsuspendable({10: 0}) is None
    why = unsuspendable({10: FEATURE_MANAGED, 11: FEATURE_IPC, 12: FEATURE_MANAGED})
    assert why is not None
    assert "process 10, 12 uses managed memory" in why
    assert "process 11 shares memory through CUDA IPC" in why


def test_a_job_resumes_at_home_when_it_fits_else_where_most_room_is():
    rooms = [Room(A, 0, 10 * G, 20 * G), Room(B, 1, 30 * G, 40 * G)]
    assert resume_target(rooms, A, 8 * G, 5 * G).uuid == A
    assert resume_target(rooms, A, 12 * G, 5 * G).uuid == B
    assert resume_target(rooms, None, 8 * G, 5 * G).uuid == B
    # promises are not enough: what it holds must be free too
    assert resume_target([Room(A, 0, 10 * G, 2 * G)], A, 8 * G, 5 * G) is None
    assert resume_target(rooms, A, 31 * G, 5 * G) is None


def test_the_fewest_victims_that_make_room():
    c = [Candidate("1", 4 * G, 10.0), Candidate("2", 8 * G, 20.0),
         Candidate("3", 3 * G, 30.0), Candidate("4", 6 * G, 40.0)]
    assert victims(c, 0) == []
    assert victims(c, 7 * G) == ["2"]                 # one job is enough
    assert sorted(victims(c, 9 * G)) == ["3", "4"]    # two: the pair that frees least
    assert victims(c, 22 * G) is None                 # all of them are not enough
    # among equals, the newest goes first
    same = [Candidate("1", 4 * G, 10.0), Candidate("2", 4 * G, 20.0)]
    assert victims(same, 3 * G) == ["2"]


def test_the_owner_is_told_what_became_of_a_job_in_one_line_per_change():
    """What `vgpuctl run` tells its terminal when the daemon pokes it
    (vgpuctl.client.launch.notice_line): a preemption, a drain, a suspend
    from elsewhere, then a resume or a move; nothing when nothing changed."""
    from vgpuctl.client.launch import notice_line

    pre = ("suspended", "preempted", 0)
    assert "a job of a higher class needed its memory on GPU 0" in notice_line("7", pre, None)
    assert "GPU 1 was drained" in notice_line("7", ("suspended", "drained", 1), None)
    assert "`vgpuctl resume 7`" in notice_line("7", ("suspended", "asked", 0), None)
    assert notice_line("7", ("running", None, 0), pre) == "job 7 resumed on GPU 0"
    assert notice_line("7", ("running", None, 1), pre) == "job 7 moved to GPU 1"
    assert notice_line("7", ("running", None, 1), ("running", None, 1)) == ""
