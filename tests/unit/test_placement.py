"""Admission and placement, driven directly (no daemon)."""

from __future__ import annotations

import pytest

from vgpuctl.core.config import UserLimits
from vgpuctl.core.placement import (
    Commitment,
    Gpu,
    capacity,
    check_core,
    check_resize,
    check_user_limits,
    place,
    place_many,
    resolve_gpu,
)
from vgpuctl.errors import AdmissionRefused, NotFound, UsageError

G = 1 << 30
M = 1 << 20
GPUS = [Gpu(0, "GPU-aaaa1111-0000", "Sim GPU", 16 * G),
        Gpu(1, "GPU-bbbb2222-0000", "Sim GPU", 16 * G)]


def test_capacity_is_total_less_reserve_times_oversubscription():
    assert capacity(GPUS[0], 512 * M) == 16 * G - 512 * M
    assert capacity(GPUS[0], 0, 1.5) == 24 * G
    assert capacity(Gpu(0, "u", "n", 100), 512 * M) == 0


def test_picks_the_gpu_with_most_uncommitted_memory():
    jobs = [Commitment("1", GPUS[0].uuid, 4 * G)]
    assert place(GPUS, jobs, 1 * G, reserve=512 * M).gpu.index == 1
    jobs.append(Commitment("2", GPUS[1].uuid, 8 * G))
    assert place(GPUS, jobs, 1 * G, reserve=512 * M).gpu.index == 0


def test_ties_go_to_the_lowest_index():
    assert place(GPUS, [], 1 * G).gpu.index == 0


def test_fills_up_to_exactly_the_capacity_and_not_a_byte_more():
    cap = 16 * G - 512 * M
    p = place(GPUS, [Commitment("1", GPUS[0].uuid, cap - G)], G, pin="0", reserve=512 * M)
    assert p.gpu.index == 0
    with pytest.raises(AdmissionRefused):
        place(GPUS, [Commitment("1", GPUS[0].uuid, cap - G)], G + 1, pin="0", reserve=512 * M)


def test_refusal_names_each_gpu_and_what_it_has_left():
    jobs = [Commitment("1", GPUS[0].uuid, 10 * G), Commitment("2", GPUS[1].uuid, 12 * G)]
    with pytest.raises(AdmissionRefused) as e:
        place(GPUS, jobs, 8 * G, reserve=512 * M)
    msg = str(e.value)
    assert "GPU 0" in msg and "5.5G left" in msg
    assert "GPU 1" in msg and "3.5G left" in msg
    assert e.value.exit_code == 6


def test_oversubscription_admits_more_than_the_memory():
    jobs = [Commitment("1", GPUS[0].uuid, 16 * G)]
    assert place(GPUS[:1], jobs, 4 * G, oversubscribe=1.5).gpu.index == 0
    with pytest.raises(AdmissionRefused):
        place(GPUS[:1], jobs, 4 * G, oversubscribe=1.0)


def test_pin_by_index_uuid_and_unique_prefix():
    assert resolve_gpu(GPUS, "1").index == 1
    assert resolve_gpu(GPUS, "GPU-bbbb2222-0000").index == 1
    assert resolve_gpu(GPUS, "gpu-bbbb").index == 1
    assert resolve_gpu(GPUS, "aaaa").index == 0
    twins = [Gpu(0, "GPU-abcd1111-0000", "X", 16 * G), Gpu(1, "GPU-abcd2222-0000", "X", 16 * G)]
    with pytest.raises(UsageError, match="matches 2 GPUs"):
        resolve_gpu(twins, "abcd")
    with pytest.raises(NotFound, match="at least 4"):
        resolve_gpu(GPUS, "GPU-")
    with pytest.raises(NotFound):
        resolve_gpu(GPUS, "7")
    with pytest.raises(NotFound):
        resolve_gpu(GPUS, "GPU-cccc")


def test_a_short_number_is_an_index_and_never_a_uuid_prefix():
    gpus = [Gpu(0, "GPU-76680000-0000", "X", 16 * G), Gpu(1, "GPU-11110000-0000", "X", 16 * G),
            Gpu(2, "GPU-1aaa0000-0000", "X", 16 * G)]
    assert resolve_gpu(gpus, "7668").index == 0     # four digits: the UUID's prefix
    assert resolve_gpu(gpus, "1").index == 1
    for spec in ("7", "11", "766", "5"):            # no such index: an error, not a prefix
        with pytest.raises(NotFound, match=f"no GPU {spec}:"):
            resolve_gpu(gpus, spec)
    with pytest.raises(NotFound, match="at least 4"):
        resolve_gpu(gpus, "1aa")


def test_pinned_job_is_refused_when_its_gpu_is_full_even_if_another_has_room():
    jobs = [Commitment("1", GPUS[0].uuid, 15 * G)]
    with pytest.raises(AdmissionRefused) as e:
        place(GPUS, jobs, 2 * G, pin="0", reserve=512 * M)
    assert "GPU 1" not in str(e.value)


def test_a_job_as_large_as_the_gpu_is_told_of_the_reserve():
    """--mem 16G on a 16G GPU: the refusal says where the other 512M went."""
    with pytest.raises(AdmissionRefused) as e:
        place(GPUS[:1], [], 16 * G, reserve=512 * M)
    assert "15.5G left of 15.5G" in str(e.value)
    assert "less the 512M kept for the driver" in str(e.value) and "`reserve`" in str(e.value)
    with pytest.raises(AdmissionRefused) as e:
        place(GPUS[:1], [], 17 * G, reserve=0)
    assert "reserve" not in str(e.value)


def test_no_gpus_is_a_refusal():
    with pytest.raises(AdmissionRefused):
        place([], [], G)


def test_resize_does_not_count_the_jobs_own_limit():
    jobs = [Commitment("1", GPUS[0].uuid, 8 * G), Commitment("2", GPUS[0].uuid, 7 * G)]
    check_resize(GPUS, jobs, "1", GPUS[0].uuid, 8 * G + 512 * M, reserve=512 * M)
    with pytest.raises(AdmissionRefused):
        check_resize(GPUS, jobs, "1", GPUS[0].uuid, 9 * G, reserve=512 * M)


def test_user_limits():
    lim = UserLimits(max_mem=8 * G, max_core=50)
    check_user_limits(lim, "alice", 8 * G, 50)
    with pytest.raises(AdmissionRefused, match="at most 8G"):
        check_user_limits(lim, "alice", 8 * G + 1, 10)
    with pytest.raises(AdmissionRefused, match="at most 50%"):
        check_user_limits(lim, "alice", G, 51)
    check_user_limits(UserLimits(), "bob", 100 * G, 100)


def test_promised_shares_on_a_gpu_add_up_to_at_most_100():
    """Compute is counted as memory is: a promise that does not fit is
    refused, naming what each GPU has left; a job with no promise (0) fits
    anywhere its memory does."""
    jobs = [Commitment("1", GPUS[0].uuid, G, 70), Commitment("2", GPUS[1].uuid, G, 50)]
    assert place(GPUS, jobs, G, core=50).gpu.index == 1
    assert place(GPUS, jobs, G, core=30).gpu.index == 0      # most memory left, room for 30
    with pytest.raises(AdmissionRefused) as e:
        place(GPUS, jobs, G, core=60)
    assert "no room for 1G and 60% of a GPU's compute" in str(e.value)
    assert "30% of its compute unpromised" in str(e.value)
    assert "50% of its compute unpromised" in str(e.value)
    assert place(GPUS, jobs + [Commitment("3", GPUS[0].uuid, G, 30)], G, core=0)
    with pytest.raises(AdmissionRefused):
        place(GPUS, jobs, G, core=40, pin="0")
    assert place(GPUS, jobs, G, core=40, pin="0", core_oversubscribe=1.2).gpu.index == 0


def test_a_promise_can_grow_only_within_what_is_left():
    jobs = [Commitment("1", GPUS[0].uuid, G, 70), Commitment("2", GPUS[0].uuid, G, 20)]
    check_core(GPUS, jobs, "2", GPUS[0].uuid, 30)               # its own 20 does not count
    with pytest.raises(AdmissionRefused, match="70% of its 100% is promised"):
        check_core(GPUS, jobs, "2", GPUS[0].uuid, 31)


# -- several GPUs ----------------------------------------------------------------
GPUS4 = [Gpu(i, f"GPU-{i}{i}{i}{i}0000-0000", "Sim GPU", 16 * G) for i in range(4)]


def test_gpus_n_takes_the_n_emptiest_gpus_given_in_index_order():
    jobs = [Commitment("1", GPUS4[0].uuid, 10 * G), Commitment("2", GPUS4[2].uuid, 2 * G)]
    where = place_many(GPUS4, jobs, 4 * G, count=2)
    assert [p.gpu.index for p in where] == [1, 3]
    assert all(p.mem == 4 * G for p in where)
    assert [p.gpu.index for p in place_many(GPUS4, jobs, 4 * G, count=3)] == [1, 2, 3]


def test_gpu_a_b_pins_those_gpus_in_the_order_given():
    where = place_many(GPUS4, [], G, pin="3,GPU-1111")
    assert [p.gpu.index for p in where] == [3, 1]


def test_several_gpus_are_placed_all_or_none():
    jobs = [Commitment("1", GPUS[1].uuid, 15 * G)]
    with pytest.raises(AdmissionRefused) as e:
        place_many(GPUS, jobs, 2 * G, count=2)
    assert "GPU 1" in str(e.value) and "on each of 2 GPUs" in str(e.value)
    with pytest.raises(AdmissionRefused) as e:
        place_many(GPUS, jobs, 2 * G, pin="0,1")
    assert "GPU 1" in str(e.value) and "GPU 0 " not in str(e.value)


@pytest.mark.parametrize("kw, error, text", [
    ({"count": 3}, AdmissionRefused, "--gpus 3: there are 2 GPUs here"),
    ({"count": 0}, UsageError, "at least one GPU"),
    ({"count": 2, "pin": "0,1"}, UsageError, "--gpus and --gpu"),
    ({"pin": "0,0"}, UsageError, "named twice"),
    ({"pin": "1,GPU-bbbb"}, UsageError, "named twice"),
    ({"pin": "0,"}, UsageError, "separated by commas"),
    ({"pin": "0,7"}, NotFound, "no GPU 7"),
])
def test_requests_for_several_gpus_that_cannot_be_placed(kw, error, text):
    with pytest.raises(error) as e:
        place_many(GPUS, [], G, **kw)
    assert text in str(e.value)


def test_one_gpu_is_placed_as_before():
    jobs = [Commitment("1", GPUS[0].uuid, 10 * G)]
    assert [p.gpu.index for p in place_many(GPUS, jobs, G)] == [1]
    assert [p.gpu.index for p in place_many(GPUS, jobs, G, pin="0")] == [0]


def test_a_promise_is_counted_on_each_of_several_gpus():
    """A job on several GPUs is promised its share on each: GPUs whose
    compute is promised away are passed over, and a pin to one of them is
    refused, saying what each has left."""
    jobs = [Commitment("1", GPUS4[0].uuid, G, 80), Commitment("2", GPUS4[2].uuid, G, 50)]
    where = place_many(GPUS4, jobs, G, count=2, core=30)
    assert [p.gpu.index for p in where] == [1, 3]        # GPU 0 has 20 % left
    assert [p.gpu.index for p in place_many(GPUS4, jobs, G, count=3, core=30)] == [1, 2, 3]
    with pytest.raises(AdmissionRefused) as e:
        place_many(GPUS4, jobs, G, pin="0,1", core=30)
    assert "no room for 1G and 30% of the compute on each of GPUs 0,1" in str(e.value)
    assert "GPU 0" in str(e.value) and "20% of its compute unpromised" in str(e.value)
    with pytest.raises(AdmissionRefused, match="on each of 4 GPUs"):
        place_many(GPUS4, jobs, G, count=4, core=30)
    assert len(place_many(GPUS4, jobs, G, count=4, core=0)) == 4     # no promise: fits


# A node of one whole GPU (1) and one in MIG mode (0) cut in two MIG devices.
MIG_NODE = [Gpu(1, "GPU-cccc3333-0000", "Sim GPU", 80 * G),
            Gpu(2, "MIG-dddd4444-0000", "Sim GPU MIG 1g.10gb", 10 * G, parent=0, mig="1g.10gb"),
            Gpu(6, "MIG-eeee5555-0000", "Sim GPU MIG 3g.40gb", 40 * G, parent=0, mig="3g.40gb")]


def test_a_mig_device_is_named_by_its_index_or_its_mig_uuid():
    assert resolve_gpu(MIG_NODE, "6").uuid.startswith("MIG-eeee")
    assert resolve_gpu(MIG_NODE, "MIG-dddd4444-0000").index == 2
    assert resolve_gpu(MIG_NODE, "dddd44").index == 2
    assert resolve_gpu(MIG_NODE, "mig-eeee").index == 6


def test_a_job_on_a_mig_device_has_it_alone():
    """CUDA gives a process one MIG device and no GPU beside it: a job
    named onto a MIG device and another GPU would see one of them."""
    for pin in ("2,6", "1,2"):
        with pytest.raises(AdmissionRefused, match="one MIG device"):
            place_many(MIG_NODE, [], 1 * G, pin=pin)
    assert [p.gpu.index for p in place_many(MIG_NODE, [], 1 * G, pin="6")] == [6]


def test_several_gpus_are_whole_gpus_never_mig_devices():
    with pytest.raises(AdmissionRefused, match="can't use MIG devices"):
        place_many(MIG_NODE, [], 1 * G, count=2)
    two = MIG_NODE + [Gpu(3, "GPU-ffff6666-0000", "Sim GPU", 80 * G)]
    assert [p.gpu.index for p in place_many(two, [], 1 * G, count=2)] == [1, 3]


def test_a_job_goes_to_the_mig_device_with_room_for_it():
    assert place(MIG_NODE[1:], [], 20 * G).gpu.index == 6
    with pytest.raises(AdmissionRefused, match="no room"):
        place(MIG_NODE[1:], [], 41 * G)
