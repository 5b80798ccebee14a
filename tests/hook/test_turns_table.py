"""The rule of turns (libvgpu/hook/turns_rule.c, vgpu_turn_decide), row by
row: tests/c/turns_table.c, built with turns_rule.c, drives the pure rule
through a table of schedules, turn states, times and work in flight, and
prints "ok NAME" or "FAIL NAME<tab>what differed" for each row."""

from __future__ import annotations

import subprocess

import pytest
from support import REPO

HOOK_DIR = REPO / "libvgpu" / "hook"

@pytest.fixture(scope="module")
def table(cbuild) -> dict[str, str]:
    """Each row's name -> "" (it passed) or what differed."""
    prog = cbuild("turns_table", "turns_table.c", f"-I{HOOK_DIR}", str(HOOK_DIR / "turns_rule.c"))
    res = subprocess.run([str(prog)], capture_output=True, text=True, timeout=60)
    assert res.stderr == "", res.stderr
    lines = res.stdout.splitlines()
    assert lines and lines[-1].startswith("rows "), res.stdout
    rows: dict[str, str] = {}
    for line in lines[:-1]:
        if line.startswith("ok "):
            rows[line[3:]] = ""
        else:
            assert line.startswith("FAIL "), line
            name, _, why = line[5:].partition("\t")
            rows[name] = why.strip()
    n, failed = int(lines[-1].split()[1]), int(lines[-1].split()[3])
    assert n == len(rows) and failed == sum(1 for w in rows.values() if w)
    assert res.returncode == (1 if failed else 0)
    return rows


def test_the_rule_of_turns(table):
    assert len(table) >= 50
    wrong = {name: why for name, why in table.items() if why}
    assert not wrong, "\n".join(f"{name}: {why}" for name, why in wrong.items())
