"""The whole NVML surface (issue 15): the simulated libnvidia-ml.so.1 exports
every entry point of the NVML version it reports, from one table (api.def),
as NVIDIA's library does; what it does not model answers
NVML_ERROR_NOT_SUPPORTED (NVML_ERROR_UNINITIALIZED before nvmlInit)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from support.nvml_api import NOT_YET_DEFINED, api_table, exported, names_file
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
    missing = table - nvml - NOT_YET_DEFINED
    assert not missing, f"in api.def, not exported: {sorted(missing)}"
    assert not nvml - table, f"exported, not in api.def: {sorted(nvml - table)}"
    others = {s for s in nvml_exports if not s.startswith("nvml")}
    assert all(s.startswith("vgpu_sim_ctl_") for s in others), sorted(others)


def test_every_name_of_nvml_h_is_exported(nvml_exports):
    missing = NVML_H - nvml_exports - NOT_YET_DEFINED
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
    assert not ours - nvml_exports - NOT_YET_DEFINED, sorted(ours - nvml_exports)
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
