"""The process's allocation table (libvgpu/hook/alloctab.c) on its own:
tests/c/alloctab_race.c, built with alloctab.c, runs each case alone and
then with threads (two frees of one pointer at once, a free beside another
thread's track of the same pointer, a context's sweep beside allocations in
another context, more pointers than the buckets hold freed by other
threads) and prints "ok NAME" or "FAIL NAME<tab>what" for each."""

from __future__ import annotations

import subprocess

import pytest
from support import REPO

HOOK_DIR = REPO / "libvgpu" / "hook"
CASES = ["basics", "spill_sweep", "double_frees", "held_is_waited", "sweep_beside",
         "many_crossed"]


@pytest.fixture(scope="module")
def cases(cbuild) -> dict[str, str]:
    """Each case's name -> "" (it passed) or what went wrong."""
    prog = cbuild("alloctab_race", "alloctab_race.c", f"-I{HOOK_DIR}",
                  str(HOOK_DIR / "alloctab.c"))
    res = subprocess.run([str(prog)], capture_output=True, text=True, timeout=300)
    assert res.stderr == "", res.stderr
    lines = res.stdout.splitlines()
    assert lines and lines[-1].startswith("cases "), res.stdout
    out: dict[str, str] = {}
    for line in lines[:-1]:
        if line.startswith("ok "):
            out[line[3:]] = ""
        else:
            assert line.startswith("FAIL "), line
            name, _, why = line[5:].partition("\t")
            out[name] = why.strip() or "failed"
    failed = int(lines[-1].split()[3])
    assert res.returncode == (1 if failed else 0)
    return out


@pytest.mark.parametrize("name", CASES)
def test_the_allocation_table(cases, name):
    assert name in cases, f"{name} did not run: {sorted(cases)}"
    assert cases[name] == "", cases[name]
