"""Job program: launch a kernel that stores through a bad pointer.

    python3 job_bad_pointer.py [--address 0x10]

Driver API through NVIDIA's cuda-bindings (no toolkit, no torch): load a
tiny PTX kernel that writes to a fixed global address (default 0x10, never
mapped), launch it, synchronise. On a real GPU the synchronisation returns
CUDA_ERROR_ILLEGAL_ADDRESS and the context is lost; the program then exits
with status 1. Prints one JSON line with each call's result.
"""

from __future__ import annotations

import argparse
from typing import Any

import job_util

PTX = """\
.version 7.0
.target sm_50
.address_size 64

.visible .entry vgpu_bad_store()
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;

    mov.u64 %rd1, ADDRESS;
    mov.u32 %r1, 48879;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default="0x10", help="where the kernel stores")
    args = ap.parse_args()
    cu = job_util.cuda_driver()
    calls: dict[str, str] = {}

    def call(name: str, res: Any) -> Any:
        res = res if isinstance(res, tuple) else (res,)
        err = res[0]
        calls[name] = getattr(err, "name", str(err))
        if int(err) != 0:
            job_util.emit({"calls": calls, "failed": name, "error": calls[name]})
            raise SystemExit(1 if name in ("cuLaunchKernel", "cuCtxSynchronize") else 3)
        return res[1] if len(res) == 2 else res[1:]

    call("cuInit", cu.cuInit(0))
    dev = call("cuDeviceGet", cu.cuDeviceGet(0))
    ctx = call("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))
    call("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
    ptx = PTX.replace("ADDRESS", str(int(args.address, 0))).encode() + b"\0"
    mod = call("cuModuleLoadData", cu.cuModuleLoadData(ptx))
    fn = call("cuModuleGetFunction", cu.cuModuleGetFunction(mod, b"vgpu_bad_store"))
    call("cuLaunchKernel", cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0))
    call("cuCtxSynchronize", cu.cuCtxSynchronize())
    # no fault: a driver that did not run the store (the simulated GPU)
    job_util.emit({"calls": calls, "error": None})


if __name__ == "__main__":
    main()
