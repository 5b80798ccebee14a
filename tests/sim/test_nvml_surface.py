"""The whole NVML surface (issue 15): the simulated libnvidia-ml.so.1 exports
every entry point of the NVML version it reports, from one table (api.def),
as NVIDIA's library does; what it does not model answers
NVML_ERROR_NOT_SUPPORTED (NVML_ERROR_UNINITIALIZED before nvmlInit); and what
monitoring tools read has plausible H100 values, following the load where a
real board's do."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
from support.nvml_api import api_table, exported, names_file
from support.sim import run_py

NVML_H = names_file("nvml_names.txt")       # NVML 13.0.39: driver 580's
HAMI_CORE = names_file("hami_core_nvml_names.txt")
# Exported by NVIDIA's library though nvml.h does not declare it.
UNDECLARED = {"nvmlInternalGetExportTable"}

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3


@pytest.fixture(scope="module")
def nvml_exports(sim_libdir: Path) -> set[str]:
    return exported(sim_libdir / "libnvidia-ml.so.1")


def pynvml_names() -> set[str]:
    """Every name nvidia-ml-py resolves (_nvmlGetFunctionPointer("...")),
    read from its source: it resolves each one only when called."""
    spec = importlib.util.find_spec("pynvml")
    assert spec is not None and spec.origin is not None
    text = Path(spec.origin).read_text()
    return set(re.findall(r"""_nvmlGetFunctionPointer\(\s*["'](\w+)["']\s*\)""", text))


# ---- the names -------------------------------------------------------------------


def test_the_table_is_nvml_h(nvml_exports):
    """api.def lists every name of nvml.h 13.0.39, and nothing else but what
    NVIDIA's library exports beside them."""
    table = set(api_table())
    assert not NVML_H - table, f"nvml.h names missing from api.def: {sorted(NVML_H - table)}"
    assert table - NVML_H == UNDECLARED


def test_the_library_exports_exactly_the_table(nvml_exports):
    table = set(api_table())
    nvml = {s for s in nvml_exports if s.startswith("nvml")}
    missing = table - nvml
    assert not missing, f"in api.def, not exported: {sorted(missing)}"
    assert not nvml - table, f"exported, not in api.def: {sorted(nvml - table)}"
    others = {s for s in nvml_exports if not s.startswith("nvml")}
    assert all(s.startswith("vgpu_sim_ctl_") for s in others), sorted(others)


def test_every_name_of_nvml_h_is_exported(nvml_exports):
    missing = NVML_H - nvml_exports
    assert not missing, f"{len(missing)} nvml.h names not exported: {sorted(missing)}"


def test_every_name_hami_core_resolves_is_exported(nvml_exports):
    missing = HAMI_CORE - nvml_exports
    assert not missing, sorted(missing)


def test_pynvml_finds_what_a_driver_580_has_and_only_that(nvml_exports, sim_env):
    """Every name nvidia-ml-py resolves that NVML 13.0 has is exported. The
    newer names a newer nvidia-ml-py knows are not: there it raises
    FunctionNotFound, as it does on a real driver 580, and tools handle that."""
    names = pynvml_names()
    assert len(names) > 300, "pynvml's names were not found in its source"
    ours = names & NVML_H
    assert not ours - nvml_exports, sorted(ours - nvml_exports)
    later = sorted(names - NVML_H)
    assert not set(later) & nvml_exports, sorted(set(later) & nvml_exports)
    if later:
        out = run_py(sim_env, f"LATER = {later[0]!r}\n", """
            import pynvml as N
            N.nvmlInit()
            try:
                N._nvmlGetFunctionPointer(LATER)
                out("found")
            except N.NVMLError_FunctionNotFound:
                out("not found")
        """)
        assert out == "not found"


# ---- what is not modeled ---------------------------------------------------------

STUB_CALLS = """
import ctypes
lib = ctypes.CDLL("libnvidia-ml.so.1")
dev = ctypes.c_void_p()
def call(name, *args):
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    return fn(*args)
u = ctypes.c_uint(12345)
def calls():
    return {
        "stub_fan": call("nvmlDeviceGetFanSpeed", dev, ctypes.byref(u)),
        "stub_gpm": call("nvmlGpmQueryDeviceSupport", dev, None),
        "stub_set": call("nvmlDeviceSetPersistenceMode", dev, 0),
        "stub_export_table": call("nvmlInternalGetExportTable", None, None),
        "modeled": call("nvmlDeviceGetPowerUsage", dev, ctypes.byref(u)),
    }
before = calls()
assert call("nvmlInit_v2") == 0
assert call("nvmlDeviceGetHandleByIndex_v2", 0, ctypes.byref(dev)) == 0
after = calls()
out({"before": before, "after": after, "untouched": u.value != 12345})
"""


def test_unmodeled_entry_points_answer_like_unsupported_features(sim_env):
    """Before nvmlInit every entry point, stubs included, says
    UNINITIALIZED, as NVIDIA's library does; after it a stub says
    NOT_SUPPORTED, whatever arguments it is called with."""
    out = run_py(sim_env, STUB_CALLS)
    assert set(out["before"].values()) == {NVML_ERROR_UNINITIALIZED}, out
    after = out["after"]
    assert after.pop("modeled") == 0
    assert set(after.values()) == {NVML_ERROR_NOT_SUPPORTED}, out
    assert out["untouched"] is True  # the power reading, not the fan stub


def test_what_an_h100_does_not_have_is_not_supported(sim_env):
    out = run_py(sim_env, """
        import pynvml as N
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        res = {}
        for name, call in {
            "fan": lambda: N.nvmlDeviceGetFanSpeed(h),
            "fan_v2": lambda: N.nvmlDeviceGetFanSpeed_v2(h, 0),
            "encoder_capacity": lambda: N.nvmlDeviceGetEncoderCapacity(h, 0),
            "retired_pages": lambda: N.nvmlDeviceGetRetiredPages(h, 0),
            "driver_model": lambda: N.nvmlDeviceGetDriverModel_v2(h),
            "acoustic": lambda: N.nvmlDeviceGetTemperatureThreshold(
                h, N.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR),
            "nvlink": lambda: N.nvmlDeviceGetNvLinkState(h, 0),
        }.items():
            try:
                call()
                res[name] = "answered"
            except N.NVMLError as e:
                res[name] = e.value
        out(res)
    """)
    assert set(out.values()) == {NVML_ERROR_NOT_SUPPORTED}, out


# ---- what monitoring tools read --------------------------------------------------

READINGS = """
import pynvml as N
N.nvmlInit()
def readings(i):
    h = N.nvmlDeviceGetHandleByIndex(i)
    ecc = N.nvmlDeviceGetEccMode(h)
    enc = N.nvmlDeviceGetEncoderUtilization(h)
    bar1 = N.nvmlDeviceGetBAR1MemoryInfo(h)
    fields = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_MEMORY_TEMP,
                                            N.NVML_FI_DEV_POWER_INSTANT,
                                            N.NVML_FI_DEV_NVLINK_LINK_COUNT])
    return {
        "util": N.nvmlDeviceGetUtilizationRates(h).gpu,
        "sm": N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
        "sm_max": N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_SM),
        "mem_clock": N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM),
        "app_sm": N.nvmlDeviceGetApplicationsClock(h, N.NVML_CLOCK_SM),
        "graphics_clocks": N.nvmlDeviceGetSupportedGraphicsClocks(h, 2619),
        "power": N.nvmlDeviceGetPowerUsage(h),
        "limit": N.nvmlDeviceGetPowerManagementLimit(h),
        "enforced": N.nvmlDeviceGetEnforcedPowerLimit(h),
        "constraints": N.nvmlDeviceGetPowerManagementLimitConstraints(h),
        "energy": N.nvmlDeviceGetTotalEnergyConsumption(h),
        "temp": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
        "slowdown": N.nvmlDeviceGetTemperatureThreshold(
            h, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "pstate": N.nvmlDeviceGetPerformanceState(h),
        "reasons": N.nvmlDeviceGetCurrentClocksEventReasons(h),
        "encoder": list(enc),
        "decoder": list(N.nvmlDeviceGetDecoderUtilization(h)),
        "encoder_stats": list(N.nvmlDeviceGetEncoderStats(h)),
        "encoder_sessions": N.nvmlDeviceGetEncoderSessions(h),
        "pcie": [N.nvmlDeviceGetCurrPcieLinkGeneration(h), N.nvmlDeviceGetCurrPcieLinkWidth(h),
                 N.nvmlDeviceGetMaxPcieLinkGeneration(h), N.nvmlDeviceGetMaxPcieLinkWidth(h)],
        "pcie_rx": N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES),
        "replays": N.nvmlDeviceGetPcieReplayCounter(h),
        "ecc": list(ecc),
        "ecc_errors": N.nvmlDeviceGetTotalEccErrors(
            h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_VOLATILE_ECC),
        "remapped": list(N.nvmlDeviceGetRemappedRows(h)),
        "persistence": N.nvmlDeviceGetPersistenceMode(h),
        "compute_mode": N.nvmlDeviceGetComputeMode(h),
        "mig": list(N.nvmlDeviceGetMigMode(h)),
        "bar1": [bar1.bar1Total, bar1.bar1Used, bar1.bar1Free],
        "board_id": N.nvmlDeviceGetBoardId(h),
        "serial": N.nvmlDeviceGetSerial(h),
        "fields": [[f.nvmlReturn, f.value.uiVal] for f in fields],
    }
"""


def test_an_idle_device_reads_as_an_idle_h100(sim_env):
    out = run_py(sim_env, READINGS, """
        out([readings(0), readings(1)])
    """)
    d, d1 = out
    assert d["util"] == 0
    assert d["sm"] < d["sm_max"] == d["app_sm"] == 1980
    assert d["mem_clock"] == 2619
    assert d["graphics_clocks"][0] == 1980 and len(d["graphics_clocks"]) > 10
    assert 50_000 <= d["power"] <= 100_000               # mW
    assert d["limit"] == d["enforced"] == 700_000
    assert d["constraints"][0] < d["constraints"][1] == 700_000
    assert d["energy"] > 0
    assert 20 <= d["temp"] <= 45 and d["slowdown"] > d["temp"]
    assert d["pstate"] == 0
    assert d["reasons"] == 0x1                           # GPU idle
    assert d["encoder"][0] == 0 and d["encoder"][1] > 0  # percent, sampling period (us)
    assert d["decoder"][0] == 0
    assert d["encoder_stats"] == [0, 0, 0] and d["encoder_sessions"] == []
    assert d["pcie"] == [5, 16, 5, 16]
    assert d["pcie_rx"] == 0 and d["replays"] == 0
    assert d["ecc"] == [1, 1] and d["ecc_errors"] == 0
    assert d["remapped"] == [0, 0, 0, 0]
    assert d["persistence"] == 1 and d["compute_mode"] == 0
    assert d["mig"] == [0, 0]
    total, used, free = d["bar1"]
    assert total == used + free and used < total
    assert d["board_id"] != d1["board_id"] and d["serial"] != d1["serial"]
    (mem_ret, mem_temp), (pwr_ret, pwr), (nvlink_ret, _) = d["fields"]
    assert (mem_ret, pwr_ret, nvlink_ret) == (0, 0, NVML_ERROR_NOT_SUPPORTED)
    assert 20 <= mem_temp <= 60 and pwr == d["power"]


def test_clocks_power_and_temperature_follow_the_load(sim_env, burn_program):
    """GPU 0 kept busy by vgpu-burn, GPU 1 idle: GPU 0's SM clock, power,
    temperature and energy rise; the clocks no longer say idle."""
    burn = subprocess.Popen([str(burn_program), "--device", "0", "--kernel-us", "10000",
                             "--seconds", "60"], env=sim_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        out = run_py(sim_env, READINGS, """
            wait_for(lambda: readings(0)["util"] >= 90, timeout=30, what="GPU 0 busy")
            e0 = readings(0)["energy"]
            time.sleep(0.5)
            out([readings(0), readings(1), e0])
        """)
    finally:
        burn.kill()
        burn.wait(timeout=30)
    busy, idle, energy_before = out
    assert busy["util"] >= 90 and idle["util"] == 0
    assert busy["sm"] > idle["sm"] and busy["sm"] <= busy["sm_max"]
    assert busy["power"] > idle["power"] and busy["power"] <= busy["limit"]
    assert busy["temp"] > idle["temp"] and busy["temp"] < busy["slowdown"]
    assert busy["reasons"] == 0 and idle["reasons"] == 0x1
    # about 600 W for 0.5 s: far more than the idle board's 70 W
    assert busy["energy"] - energy_before > 150_000      # mJ
