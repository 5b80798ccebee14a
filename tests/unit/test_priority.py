"""Priority classes, the pure part (vgpuctl.core.classes): who may use which
class, who may change it, and whom each job on a GPU heeds."""

from __future__ import annotations

import pytest

from vgpuctl.core import classes as P
from vgpuctl.errors import PermissionDenied


def test_high_is_for_root_and_the_users_and_groups_named():
    may = P.may_use
    assert may("low", "bob", [], False, [], []) and may("normal", "bob", [], False, [], [])
    assert not may("high", "bob", ["users"], False, ["alice"], ["inference"])
    assert may("high", "alice", [], False, ["alice"], [])
    assert may("high", "carol", ["users", "inference"], False, [], ["inference"])
    assert may("high", "root", [], True, [], [])
    with pytest.raises(PermissionDenied, match="may not run jobs of priority high"):
        P.check_class("high", "bob", [], False, ["alice"], [])


@pytest.mark.parametrize("old,new,admin,ok", [
    ("high", "normal", False, True), ("normal", "low", False, True),
    ("low", "low", False, True), ("low", "normal", False, False),
    ("normal", "high", False, False), ("low", "high", True, True)])
def test_a_user_may_lower_a_jobs_class_only_root_may_raise_it(old, new, admin, ok):
    if ok:
        P.check_change(old, new, "7", admin)
    else:
        with pytest.raises(PermissionDenied, match="only root may raise it"):
            P.check_change(old, new, "7", admin)


def test_each_job_heeds_every_job_of_a_higher_class_on_its_gpu():
    ms = [P.Seat("h", "3", 0, "high"), P.Seat("n", "5", 1, "normal"),
          P.Seat("l", "9", 0, "low"), P.Seat("l2", "10", 0, "low")]
    h = P.holds(ms)
    assert h["h"] == P.Hold(P.SIGNAL, ())
    assert h["n"] == P.Hold(P.HELD | P.SIGNAL, (("3", 0, 2),))
    assert h["l"] == P.Hold(P.HELD, (("3", 0, 2), ("5", 1, 1)))
    assert h["l2"] == h["l"]          # two of one class hold nothing of each other
    # jobs of one class only: nothing to heed, the launch fast path
    assert set(P.holds([P.Seat("a", "1", 0, "normal"),
                        P.Seat("b", "2", 0, "normal")]).values()) == {P.Hold()}


def test_at_most_max_holders_the_highest_classes_first():
    ms = [P.Seat(i, str(i + 1), 0, "normal") for i in range(10)]
    ms.append(P.Seat("top", "99", 0, "high"))
    ms.append(P.Seat("me", "100", 0, "low"))
    held = P.holds(ms, max_holders=3)["me"].holders
    assert held == (("99", 0, 2), ("1", 0, 1), ("2", 0, 1))



# -- SignalCheck: a signal that claims work the GPU doesn't run -----------------
@pytest.mark.parametrize("claims,device,distrusted", [
    (True, 0.0, True),        # busy by its word, the GPU idle: a lie
    (True, 1.0, False),       # busy, and the GPU is
    (True, 0.6, False),       # within the margin (its estimate runs ahead)
    (True, 0.45, True),       # claims 1.0, the device 0.45: past the margin
    (False, 0.0, False),      # says nothing
])
def test_signal_check_judges_claims_against_the_device(claims, device, distrusted):
    sc = P.SignalCheck()
    now, turned = 0.0, False
    for _ in range(40):                       # 4 s of 100 ms ticks
        now += 0.1
        turned |= sc.sample("h", claims, device, now, 0.1)
    assert turned is distrusted
    assert sc.believed("h", now) is not distrusted


def test_signal_check_waits_for_enough_samples_and_forgives_after_a_while():
    sc = P.SignalCheck()
    now = 0.0
    for i in range(P.CLAIM_MIN_SAMPLES - 1):
        now += 1.0                            # (long ticks: the averages are full)
        assert not sc.sample("h", True, 0.0, now, 1.0), i
    now += 1.0
    assert sc.sample("h", True, 0.0, now, 1.0)
    assert not sc.believed("h", now + P.DISTRUST_S - 0.1)
    assert sc.believed("h", now + P.DISTRUST_S)
    sc.forget([])
    assert sc.believed("h", now)              # a holder gone is forgotten
