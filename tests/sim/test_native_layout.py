"""The native tree keeps the shape docs/architecture.md and docs/simulator.md
describe (issue 14): the simulator's files depend on each other in one
direction only, and its three directories in the allowed directions; one
size parser serves every native part, to the table tests/data/sizes.json;
and the hook's dlsym is right by construction, not by the optimiser's
grace: built at -O0, RTLD_NEXT still resolves from the caller."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest
from support import REPO
from support.hook import (
    CUDA_ERROR_DEVICE_UNAVAILABLE,
    CUDA_ERROR_OUT_OF_MEMORY,
    GiB,
    MiB,
    clean_env,
    results,
    run,
)
from support.nvml_api import api_table

from vgpuctl.system import native

LIBVGPU = REPO / "libvgpu"
SIM = LIBVGPU / "sim"

# What each simulator directory may use besides itself.
SIM_MAY_USE = {"common": set(), "cuda": {"common"}, "nvml": {"common"}}
# The build target each directory's files are compiled for.
SIM_TARGET = {"common": "sim-cuda", "cuda": "sim-cuda", "nvml": "sim-nvml"}


def _build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vgpu_native_build", LIBVGPU / "build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _name(src: Path) -> str:
    """A simulator file as docs name it: cuda/context.c."""
    return src.relative_to(SIM).as_posix()


@pytest.fixture(scope="module")
def sim_symbols(tmp_path_factory) -> dict[str, tuple[set[str], set[str]]]:
    """Each simulator .c file, compiled alone with its target's flags: the
    global symbols it defines and those it uses from elsewhere."""
    build = _build_module()
    out = tmp_path_factory.mktemp("sim-objects")
    sources = sorted(SIM.glob("*/*.c"))
    assert {s.parent.name for s in sources} == set(SIM_MAY_USE), sources

    def compile_one(src: Path) -> tuple[str, set[str], set[str]]:
        obj = out / (_name(src).replace("/", "__") + ".o")
        cmd = ["gcc", *build.compile_flags(SIM_TARGET[src.parent.name]), "-c", str(src),
               "-o", str(obj)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        nm = subprocess.run(["nm", "-P", str(obj)], capture_output=True, text=True,
                            timeout=60, check=True).stdout
        defined: set[str] = set()
        used: set[str] = set()
        for line in nm.splitlines():
            fields = line.split()
            if len(fields) < 2:
                continue
            sym, kind = fields[0], fields[1]
            if kind in ("U", "v", "w"):      # undefined, or weak and undefined
                used.add(sym)
            elif kind.isupper() or kind in ("i", "u"):
                defined.add(sym)
        return _name(src), defined, used - defined

    with ThreadPoolExecutor(max_workers=8) as pool:
        return {name: (d, u) for name, d, u in pool.map(compile_one, sources)}


def _edges(symbols: dict[str, tuple[set[str], set[str]]]) -> dict[str, dict[str, set[str]]]:
    """file -> {file it uses: the symbols it uses of it}."""
    owner: dict[str, str] = {}
    for name, (defined, _) in symbols.items():
        for sym in defined:
            assert sym not in owner, f"{sym} is defined in {owner[sym]} and {name}"
            owner[sym] = name
    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for name, (_, used) in symbols.items():
        for sym in used:
            if sym in owner:
                edges[name][owner[sym]].add(sym)
    return edges


def _find_circle(nodes: list[str], edges: dict[str, dict[str, set[str]]]) -> list[str] | None:
    """A circle of files (first file repeated at the end), or None."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(edges.get(n, {})):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in nodes:
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_simulator_files_depend_on_each_other_one_way(sim_symbols):
    """No circle between the simulator's files: each uses only files that do
    not use it back, however indirectly (see docs/simulator.md, Sources)."""
    edges = _edges(sim_symbols)
    circle = _find_circle(sorted(sim_symbols), edges)
    if circle:
        steps = [f"{a} -> {b} ({', '.join(sorted(edges[a][b]))})"
                 for a, b in itertools.pairwise(circle)]
        pytest.fail("the simulator's files use each other in a circle:\n  " + "\n  ".join(steps))


def test_the_tests_circle_finder_finds_circles():
    edges = {"a.c": {"b.c": {"f"}}, "b.c": {"c.c": {"g"}}, "c.c": {"a.c": {"h"}}}
    assert _find_circle(["a.c", "b.c", "c.c"], edges) == ["a.c", "b.c", "c.c", "a.c"]
    assert _find_circle(["a.c", "b.c"], {"a.c": {"b.c": {"f"}}}) is None


def test_simulator_directories_depend_one_way(sim_symbols):
    """cuda/ and nvml/ may use common/; common/ uses neither; cuda/ and nvml/
    never use each other, in symbols or in include lines."""
    wrong = []
    for name, used in _edges(sim_symbols).items():
        src_dir = name.split("/")[0]
        for target, syms in used.items():
            dst_dir = target.split("/")[0]
            if dst_dir != src_dir and dst_dir not in SIM_MAY_USE[src_dir]:
                wrong.append(f"{name} uses {target}: {', '.join(sorted(syms))}")
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
    for src in sorted(SIM.glob("*/*.[ch]")) + sorted(SIM.glob("*/*.def")):
        src_dir = src.parent.name
        for inc in include.findall(src.read_text()):
            if inc.startswith("../"):
                wrong.append(f"{_name(src)} includes {inc} (name the layer: common/...)")
            elif "/" in inc and not inc.startswith("vgpu/"):
                dst_dir = inc.split("/")[0]
                if dst_dir not in SIM_MAY_USE[src_dir]:
                    wrong.append(f"{_name(src)} includes {inc}")
    assert not wrong, "\n".join(wrong)


def test_nvml_entry_points_are_defined_where_api_def_says(sim_symbols):
    """Each entry point of nvml/api.def is defined by the file it names
    (`stub`: the generated ones of stubs.c), and nvml/ defines no other."""
    table = api_table()
    defined_by = {sym: name for name, (defined, _) in sim_symbols.items()
                  if name.startswith("nvml/") for sym in defined}
    wrong = []
    for sym, where in sorted(table.items()):
        want = "nvml/stubs.c" if where == "stub" else f"nvml/{where}.c"
        got = defined_by.get(sym)
        if got != want:
            wrong.append(f"{sym}: api.def says {want}, defined in {got or 'no file'}")
    extra = sorted(s for s in defined_by if s.startswith("nvml") and s not in table
                   and not s.startswith("nvml_"))
    wrong += [f"{s}: defined in {defined_by[s]}, not in api.def" for s in extra]
    assert not wrong, "\n".join(wrong)


# ---- one size grammar ------------------------------------------------------------

SIZES = json.loads((REPO / "tests" / "data" / "sizes.json").read_text())["cases"]
CUDA_ERROR_NO_DEVICE = 100


@pytest.fixture(scope="module")
def size_check(tmp_path_factory) -> Path:
    """tests/c/size_check.c with libvgpu/common/size.c, compiled as the hook
    compiles it."""
    build = _build_module()
    prog = tmp_path_factory.mktemp("size-check") / "size_check"
    cmd = ["gcc", *build.compile_flags("hook"), "-o", str(prog),
           str(REPO / "tests" / "c" / "size_check.c"), str(LIBVGPU / "common" / "size.c")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
    return prog


def test_the_size_parser_reads_every_case_of_the_table(size_check):
    res = subprocess.run([str(size_check), *(text for text, _ in SIZES)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = res.stdout.splitlines()
    assert len(got) == len(SIZES)
    wrong = [f"{text!r}: want {'error' if want is None else want}, got {g}"
             for (text, want), g in zip(SIZES, got, strict=True)
             if g != ("error" if want is None else str(want))]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("text,limit", [
    ("1.5G", 1536 * MiB),
    (" 768 MiB ", 768 * MiB),
    ("1e9", None),          # strtod read this as 10^9 bytes
    ("0x40000000", None),
    ("0.5", None),
    ("4", None),            # no unit: not 4 bytes
    ("1073741824", None),
    ("1073741824B", 1024 * MiB),
])
def test_vgpu_mem_limit_is_read_with_the_size_grammar(text, limit, sim, clients):
    res = run(clients["direct"], ["ctx", "0", "info"], sim.job_env(None, VGPU_MEM_LIMIT=text))
    assert res.returncode == 0, res.stderr
    if limit is None:
        assert results(res.stdout, "ctx")[0][0] == str(CUDA_ERROR_DEVICE_UNAVAILABLE)
        assert f"VGPU_MEM_LIMIT={text} is not a size" in res.stderr
    else:
        assert int(results(res.stdout, "info")[0][2]) == limit, res.stderr


DEVICE_MEMORY = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
rc = lib.cuInit(0)
total = ctypes.c_size_t(0)
if rc == 0:
    lib.cuDeviceTotalMem_v2(ctypes.byref(total), 0)
print(rc, total.value)
"""


@pytest.mark.parametrize("spec,memory", [
    ("2x1.5G", 1536 * MiB),
    ("1x 512 MiB", 512 * MiB),
    ("2x1e10", None),       # strtod read this as 10^10 bytes
    ("2x16GG", None),
])
def test_vgpu_sim_is_read_with_the_size_grammar(spec, memory, tmp_path):
    env = clean_env()
    env.update({"VGPU_SIM": spec, "VGPU_SIM_STATE": str(tmp_path / "simstate")})
    res = subprocess.run([sys.executable, "-c", DEVICE_MEMORY,
                          str(native.sim_libdir() / "libcuda.so.1")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rc, total = (int(v) for v in res.stdout.split())
    if memory is None:
        assert rc == CUDA_ERROR_NO_DEVICE and f"VGPU_SIM={spec}" in res.stderr
    else:
        assert (rc, total) == (0, memory), res.stderr


# ---- dlsym at any optimisation level -------------------------------------------


@pytest.fixture(scope="module")
def hook_builds(tmp_path_factory) -> dict[str, Path]:
    """The installed libvgpu.so (-O2) and one built with VGPU_CFLAGS=-O0,
    where no call becomes a tail call."""
    out = tmp_path_factory.mktemp("hook-O0")
    env = dict(os.environ, VGPU_CFLAGS="-O0")
    res = subprocess.run([sys.executable, str(LIBVGPU / "build.py"), str(out), "hook"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    cc = os.environ.get("CC", "gcc")
    said = [line for line in res.stderr.splitlines() if line.strip() and not line.startswith(cc)]
    assert not said, res.stderr     # -Wall -Wextra clean at -O0 too
    return {"O2": native.hook_library(), "O0": out / "libvgpu.so"}


@pytest.mark.parametrize("opt", ["O2", "O0"])
def test_rtld_next_resolves_from_the_caller(opt, hook_builds, sim, cbuild):
    """Another interposer preloaded after the hook finds the next time() with
    dlsym(RTLD_NEXT), not its own."""
    shim = cbuild("next_shim.so", "next_shim.c", shared=True)
    env = sim.job_env()
    env["LD_PRELOAD"] = f"{hook_builds[opt]}:{shim}"
    res = run(Path(sys.executable), ["-c", "pass"], env)
    assert res.returncode == 0, res.stderr
    assert "next_shim: ok" in res.stderr, res.stderr


@pytest.mark.parametrize("opt", ["O2", "O0"])
def test_wrapped_names_found_through_dlsym_stay_hooked(opt, hook_builds, sim, clients):
    """dlopen + dlsym of the driver's names gives the hook's wrappers: the
    limit holds (1 GiB: 512 MiB fits, 600 MiB more does not)."""
    region = sim.region([GiB, GiB])
    env = sim.job_env(region.path)
    env["LD_PRELOAD"] = str(hook_builds[opt])
    res = run(clients["dlsym"], ["ctx", "0", "alloc", "512M", "alloc", "600M",
                                 "sym", "cuMemAlloc_v2", "ptr", "cuMemAlloc_v2"], env)
    assert res.returncode == 0, res.stderr
    assert [a[0] for a in results(res.stdout, "alloc")] == ["0", str(CUDA_ERROR_OUT_OF_MEMORY)]
    (_, _, found), = results(res.stdout, "sym")
    assert results(res.stdout, "ptr")[0][1] == found


WRAPPED_NEXT = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
shim = ctypes.CDLL(sys.argv[1])
shim.next_shim_cu_next.restype = ctypes.c_void_p
addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value
print("next", shim.next_shim_cu_next(), addr(cuda.cuMemAlloc_v2), addr(shim.cuMemAlloc_v2))
"""


@pytest.mark.parametrize("opt", ["O2", "O0"])
def test_rtld_next_of_a_wrapped_name_resolves_from_the_caller(opt, hook_builds, sim, cbuild):
    """An interposer after the hook asks dlsym(RTLD_NEXT, "cuMemAlloc_v2"):
    it gets what the rest of the process gets for the driver's function (the
    hook's wrapper), not its own function back."""
    shim = cbuild("next_shim.so", "next_shim.c", shared=True)
    region = sim.region([GiB, GiB])
    env = sim.job_env(region.path)
    env["LD_PRELOAD"] = f"{hook_builds[opt]}:{shim}"
    res = run(Path(sys.executable), ["-c", WRAPPED_NEXT, str(shim)], env)
    assert res.returncode == 0, res.stderr
    (nxt, driver, own), = results(res.stdout, "next")
    assert nxt != own, "RTLD_NEXT gave the interposer its own cuMemAlloc_v2"
    assert nxt == driver


def size_table() -> list[tuple[str, list[str], int]]:
    """docs/simulator.md's "Size, and what it earns": each part's file
    globs (relative to libvgpu/sim) and its lines."""
    doc = (REPO / "docs" / "simulator.md").read_text()
    section = doc[doc.index("### Size, and what it earns"):]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].replace(",", "").isdigit():
            rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1]),
                         int(cells[2].replace(",", ""))))
    return rows


def test_the_simulator_is_held_to_what_each_part_earns():
    """Every source file of the simulator is in exactly one part of the
    docs' size table, and no part has grown past its lines by a tenth."""
    rows = size_table()
    assert len(rows) >= 8
    files = {p for p in SIM.rglob("*") if p.is_file() and p.suffix in (".c", ".h", ".def")}
    owner: dict[Path, list[str]] = defaultdict(list)
    for part, globs, _ in rows:
        for g in globs:
            for p in SIM.glob(g):
                owner[p].append(part)
    assert sorted(str(p.relative_to(SIM)) for p in files if len(owner[p]) != 1) == []
    grown = {}
    for part, _, lines in rows:
        have = sum(len(p.read_text().splitlines())
                   for p in files if owner[p] == [part])
        if have > lines * 1.1:
            grown[part] = (lines, have)
    assert grown == {}, "parts past their lines in docs/simulator.md (say what they earn)"
