"""The unit tier: the pure core and the store, in this process. A unit test
starts no process (no subprocess, no fork, no simulated GPU) and needs no
compiled part; `pytest tests/unit` runs in about a second. Anything that
needs more belongs in another tier."""

from __future__ import annotations

import os
import subprocess

import pytest


def _refuse(*args, **kwargs):
    raise AssertionError("a unit test may not start a process: move it to another tier")


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "Popen", _refuse)
    monkeypatch.setattr(os, "fork", _refuse)
    monkeypatch.setattr(os, "posix_spawn", _refuse)
