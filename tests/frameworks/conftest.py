"""The frameworks' tier: PyTorch (and torchvision) on the simulated GPU, bare
and under `vgpuctl run`. Skipped where torch is not importable; `.ci/run`
installs the pinned versions and runs this tier as its second step."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")

from support.hook import sim  # noqa: E402, F401
