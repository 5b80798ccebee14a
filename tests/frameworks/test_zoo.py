"""A model zoo on the simulated GPU, bare and under `vgpuctl run`: stock
torchvision and `transformers` models (random weights, built from their
configurations: nothing is downloaded) in the modes users train and serve
in: fp32, fp16 with GradScaler, bf16, batch-1 inference, and torch.compile
in fp32 and under autocast; and CuPy<->PyTorch, cuFFT and CUDA IPC
(tests/frameworks/zoo.py runs each). Every call the frameworks make must
succeed; kernels don't compute here, so values are not checked.

torch.compile (Inductor, Triton: ptxas and a C compiler on the host, the
cubins loaded with cuModuleLoadData) costs tens of seconds per model on a
small host, so CI compiles two models of the zoo (a convolutional network and
a transformer); VGPU_ZOO_COMPILE=all compiles every one. Both runs of a
model share one Inductor cache, as a user's would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon import needs_native

pytestmark = needs_native
pytest.importorskip("transformers")

ZOO = Path(__file__).resolve().parent / "zoo.py"
MODELS = ["resnet18", "resnet50", "mobilenet_v3", "efficientnet_b0", "vit_b_16",
          "convnext_tiny", "gpt2", "bert"]
EAGER = ["fp32", "fp16", "bf16", "infer1"]
COMPILED = ["compile", "compile16"]
COMPILE_MODELS = (set(MODELS) if os.environ.get("VGPU_ZOO_COMPILE") == "all"
                  else {"resnet18", "gpt2"})
CASES = ["interop", "fft", "ipc"]


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> dict[str, str]:
    """One Inductor and Triton cache for the module: a model compiled bare
    is found there under `vgpuctl run`."""
    d = tmp_path_factory.mktemp("inductor")
    return {"TORCHINDUCTOR_CACHE_DIR": str(d), "TRITON_CACHE_DIR": str(d / "triton"),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def modes(model: str) -> list[str]:
    return EAGER + (COMPILED if model in COMPILE_MODELS else [])


def check(r: subprocess.CompletedProcess[str], want: list[str]) -> None:
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    failed = [ln for ln in lines if not ln.get("ok")]
    assert not failed, json.dumps(failed, indent=1)
    assert [ln["mode"] for ln in lines] == want, r.stdout + r.stderr[-4000:]
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.parametrize("model", MODELS + CASES)
def test_zoo_bare(sim, caches, model):
    want = modes(model) if model in MODELS else ["case"]
    r = subprocess.run([sys.executable, str(ZOO), model, *(want if model in MODELS else [])],
                       env={**sim.env, **caches}, capture_output=True, text=True, timeout=1200)
    check(r, want)


@pytest.mark.parametrize("model", MODELS + CASES)
def test_zoo_under_vgpuctl_run(daemon_factory, caches, model):
    """The same under `vgpuctl run --mem 8G --core 50`: the hook's limit and
    gate change nothing a framework sees but the limit."""
    d = daemon_factory(gpus="1x16G")
    want = modes(model) if model in MODELS else ["case"]
    r = d.cli("run", "--mem", "8G", "--core", "50", "--", sys.executable, str(ZOO), model,
              *(want if model in MODELS else []), env=caches, timeout=1200)
    check(r, want)
