"""A model zoo on the (simulated) GPU: stock models, random weights, one
step in each of the modes users run; and the libraries users hand data
between. `python zoo.py MODEL [MODE...]` prints one JSON line per mode:
{"model", "mode", "ok", "seconds"} (and "error").

Models: torchvision's ResNet-18/50, MobileNetV3 (large), EfficientNet-B0,
ViT-B/16, ConvNeXt-T; GPT-2 and BERT built from `transformers`' default
configurations (nothing is downloaded). Modes:

  fp32      a training step (forward, loss, backward, SGD)
  fp16      a training step under torch.autocast(float16) with GradScaler
  bf16      a training step under torch.autocast(bfloat16)
  infer1    inference at batch 1 (eval, no_grad)
  compile   torch.compile'd training step, fp32
  compile16 torch.compile'd training step under autocast(float16)

and three cases that are not models (`python zoo.py CASE`):

  interop   CuPy <-> PyTorch, both ways, by __cuda_array_interface__ and by
            DLPack
  fft       torch.fft (fft, rfft2, stft) and cupy.fft: cuFFT's plans
  ipc       torch.multiprocessing hands a CUDA tensor to a process it spawned
            (CUDA IPC of memory and events): the child sees its bytes

Kernels don't compute on the simulator, so values are not checked (but the
bytes a copy put in memory, which IPC hands over): a mode passes when every
call the framework makes succeeds.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

VISION = {
    "resnet18": "resnet18", "resnet50": "resnet50", "mobilenet_v3": "mobilenet_v3_large",
    "efficientnet_b0": "efficientnet_b0", "vit_b_16": "vit_b_16", "convnext_tiny": "convnext_tiny",
}
LANGUAGE = ("gpt2", "bert")
MODELS = (*VISION, *LANGUAGE)
CASES = ("interop", "fft", "ipc")
MODES = ("fp32", "fp16", "bf16", "infer1", "compile", "compile16")
BATCH = 2
SEQ = 128


def build(name: str) -> tuple[torch.nn.Module, callable, callable]:
    """The model on the GPU, a function making a batch of n, and the loss of
    an output against that batch."""
    if name in VISION:
        import torchvision

        model = getattr(torchvision.models, VISION[name])(weights=None, num_classes=1000)

        def batch(n: int):
            return (torch.randn(n, 3, 224, 224, device="cuda"),
                    torch.randint(0, 1000, (n,), device="cuda"))

        def loss(out, b):
            return torch.nn.functional.cross_entropy(out.float(), b[1])

        return model.cuda(), batch, loss
    import transformers

    transformers.logging.set_verbosity_error()
    if name == "gpt2":
        cfg = transformers.GPT2Config()
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.BertConfig()
        model = transformers.BertForSequenceClassification(cfg)
    vocab = cfg.vocab_size

    def batch(n: int):
        ids = torch.randint(0, vocab, (n, SEQ), device="cuda")
        return ids, torch.ones_like(ids)

    def loss(out, b):
        return out.logits.float().mean()

    model.cuda()

    def call(m, b):
        return m(input_ids=b[0], attention_mask=b[1])

    model.zoo_call = call  # type: ignore[attr-defined]
    return model, batch, loss


def forward(model, b):
    call = getattr(model, "zoo_call", None)
    return call(model, b) if call else model(b[0])


def train_step(model, fwd, batch, loss, dtype=None, scaler=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model.train()
    b = batch(BATCH)
    opt.zero_grad(set_to_none=True)
    if dtype is None:
        out = loss(fwd(model, b), b)
        out.backward()
        opt.step()
    else:
        with torch.autocast("cuda", dtype=dtype):
            out = loss(fwd(model, b), b)
        if scaler is not None:
            scaler.scale(out).backward()
            scaler.step(opt)
            scaler.update()
        else:
            out.backward()
            opt.step()
    torch.cuda.synchronize()


def run(name: str, mode: str, model, batch, loss) -> None:
    if mode == "fp32":
        train_step(model, forward, batch, loss)
    elif mode == "fp16":
        train_step(model, forward, batch, loss, torch.float16, torch.amp.GradScaler("cuda"))
    elif mode == "bf16":
        train_step(model, forward, batch, loss, torch.bfloat16)
    elif mode == "infer1":
        model.eval()
        with torch.no_grad():
            forward(model, batch(1))
        torch.cuda.synchronize()
    elif mode in ("compile", "compile16"):
        compiled = torch.compile(model)
        dtype = torch.float16 if mode == "compile16" else None
        scaler = torch.amp.GradScaler("cuda") if dtype else None
        train_step(compiled, forward, batch, loss, dtype, scaler)
    else:
        raise SystemExit(f"unknown mode {mode}")


def case_interop() -> None:
    import cupy

    t = torch.arange(1024, device="cuda", dtype=torch.float32)
    c = cupy.asarray(t)                          # __cuda_array_interface__
    d = cupy.from_dlpack(t)                      # DLPack, torch -> CuPy
    back = torch.as_tensor(c, device="cuda")     # __cuda_array_interface__, CuPy -> torch
    e = torch.from_dlpack(cupy.ones(16, dtype=cupy.float32))   # DLPack, CuPy -> torch
    assert c.data.ptr == t.data_ptr() == d.data.ptr == back.data_ptr()
    assert e.shape == (16,)
    torch.cuda.synchronize()


def case_fft() -> None:
    import cupy

    x = torch.randn(8, 4096, device="cuda")
    torch.fft.fft(x)
    torch.fft.rfft2(torch.randn(4, 64, 64, device="cuda"))
    torch.stft(x, 512, window=torch.hann_window(512, device="cuda"), return_complex=True)
    cupy.fft.fft(cupy.ones(4096, dtype=cupy.complex64))
    torch.cuda.synchronize()


def _ipc_child(q, r) -> None:   # noqa: ANN001 - multiprocessing queues
    t = q.get()
    r.put((tuple(t.shape), t.device.type, t[:4].cpu().tolist()))
    del t


def case_ipc() -> None:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_ipc_child, args=(q, r))
    p.start()
    t = torch.tensor([1.0, 2.0, 3.0, 42.0] * 256, device="cuda")   # a copy: real bytes
    q.put(t)
    got = r.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0, p.exitcode
    assert got == ((1024,), "cuda", [1.0, 2.0, 3.0, 42.0]), got


def main(argv: list[str]) -> int:
    name, modes = argv[0], argv[1:] or list(MODES)
    if name in CASES:
        t0 = time.monotonic()
        rec = {"model": name, "mode": "case"}
        try:
            globals()[f"case_{name}"]()
            rec["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported
            rec.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000],
                       where=traceback.format_exc()[-2000:])
        rec["seconds"] = round(time.monotonic() - t0, 2)
        print(json.dumps(rec), flush=True)
        return 0 if rec["ok"] else 1
    if name not in MODELS:
        raise SystemExit(f"unknown model {name}: one of {', '.join(MODELS)}")
    torch.manual_seed(0)
    model, batch, loss = build(name)
    failed = 0
    for mode in modes:
        t0 = time.monotonic()
        rec = {"model": name, "mode": mode}
        try:
            run(name, mode, model, batch, loss)
            rec["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported, the next mode runs
            rec.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000],
                       where=traceback.format_exc()[-2000:])
            failed += 1
        rec["seconds"] = round(time.monotonic() - t0, 2)
        print(json.dumps(rec), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
