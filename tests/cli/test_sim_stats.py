"""`vgpuctl sim stats` as text: every line it can show, from a state made
here (the simulator's own is read in tests/sim)."""

from __future__ import annotations

import pytest

from vgpuctl.system.simstate import DeviceShare, DeviceStats, ProcessStats, SimStats, TagStats

MiB = 1 << 20
UUID0 = "GPU-d1d7f5c3-0b3e-4b3c-b29b-94600f3fb95e"
UUID1 = "GPU-76682147-0124-4c8f-bda4-39a9c11f6e86"


def stats_text(state, capsys, monkeypatch):
    """What `vgpuctl sim stats` prints of state: (exit code, stdout, stderr)."""
    from vgpuctl import cli

    class Fake:
        def stats(self):
            return state

    monkeypatch.setattr("vgpuctl.cli.commands.sim._state", Fake)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["sim", "stats"])
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def state(**changes):
    devices = [DeviceStats(0, UUID0, 16 << 30, 300 * MiB, 1_500_000_000, 12, 0),
               DeviceStats(1, UUID1, 16 << 30, 0, 0, 0, 2)]
    fields = dict(path="/dev/shm/vgpu-sim-1000", count=2, memory=16 << 30, sample_ms=1000,
                  nvml_error=0, nvml_error_count=0, devices=devices, processes=[], tags=[])
    fields.update(changes)
    return SimStats(**fields)


def test_an_idle_state_is_its_settings_and_gpus(capsys, monkeypatch):
    assert stats_text(state(), capsys, monkeypatch) == (0, (
        "state /dev/shm/vgpu-sim-1000: 2 GPU(s), sample period 1000 ms, idle periods "
        "averaged in, time slice 0 us, switch 0 us, utilization of one process a period "
        "(the last to run)\n"
        "GPU  UUID                                             used       total"
        "    busy s   kernels  fail-allocs\n"
        f"0    {UUID0}      300 MiB   16384 MiB     1.500        12  0\n"
        f"1    {UUID1}        0 MiB   16384 MiB     0.000         0  2\n"), "")


def test_processes_tags_faults_and_checkpoints_each_have_their_lines(capsys, monkeypatch):
    busy = DeviceShare(0, 100 * MiB, 200 * MiB, 250_000_000, contexts=1)
    idle = DeviceShare(1, 0, 0, 0)
    held = DeviceShare(1, 0, 0, 0, held=64 * MiB)
    processes = [ProcessStats(41, "train", [busy, idle]),
                 ProcessStats(42, None, [held], checkpoint="checkpointed"),
                 ProcessStats(43, None, [idle], checkpoint="locked")]
    tags = [TagStats("train", [busy, idle]), TagStats("peak-only", [DeviceShare(1, 0, MiB, 0)])]
    code, out, err = stats_text(state(processes=processes, tags=tags, util_idle="skip",
                                      util_procs="each", timeslice_us=2000, switch_us=25,
                                      nvml_error=999, nvml_error_count=-1),
                                capsys, monkeypatch)
    lines = out.splitlines()
    assert (code, err) == (0, "")
    assert lines[0].endswith("idle periods skipped, time slice 2000 us, switch 25 us, "
                             "utilization of each process")
    assert lines[1] == "fault: NVML calls return 999 (until cleared)"
    assert lines[5:] == [
        "",
        "         pid/name         tag          GPU         used        peak    busy s",
        "process  41               train        0        100 MiB     200 MiB     0.250",
        "process  42               -            1          0 MiB       0 MiB     0.000",
        "tag      train                         0        100 MiB     200 MiB     0.250",
        "tag      peak-only                     1          0 MiB       1 MiB     0.000",
        "process 42: checkpointed, 64 MiB of device memory in host memory",
        "process 43: locked",
    ]
    code, out, err = stats_text(state(util_procs="sometimes", nvml_error=3,
                                      nvml_error_count=2), capsys, monkeypatch)
    assert out.splitlines()[0].endswith("utilization of sometimes")
    assert out.splitlines()[1] == "fault: NVML calls return 3 (2 more)"


def test_no_state_yet_is_one_line(capsys, monkeypatch):
    code, out, err = stats_text(None, capsys, monkeypatch)
    assert (code, out) == (2, "")
    assert err == ("vgpuctl: error: no simulated GPU state yet (it is created when a program "
                   "first uses the simulated GPU)\n")
