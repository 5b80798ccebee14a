"""Job program: holds SIZE of known data on the GPU (PyTorch or CuPy), then
answers the harness's lines on stdin with one JSON line each, so that the
harness can suspend, resume and move it and check what it holds.

    python3 job_suspend.py torch|cupy SIZE_BYTES

First line: {"ready": DIGEST, "uuid": ..., "pid": ...}. Then for each line
"check": {"digest": DIGEST, "uuid": ..., "result": ...}: DIGEST covers every
byte it holds (CRC-32 of each 64 MiB chunk, copied back to the host), and
"result" is a small computation done again on the GPU now (a matrix
product with PyTorch, elementwise and a reduction with CuPy) (on a real
GPU, the same numbers as before the suspension; on the simulated GPU, whose
kernels compute nothing, zeros). The data is made on the host and copied in,
so the digest is meaningful on the simulator too. "uuid" is the driver's
word for its device 0 (cuDeviceGetUuid: the runtime keeps what it read at
start).
"""

from __future__ import annotations

import ctypes
import sys
import uuid as uuidlib
import zlib

import job_util

CHUNK = 64 << 20


def device_uuid() -> str:
    b = ctypes.create_string_buffer(16)
    ctypes.CDLL("libcuda.so.1").cuDeviceGetUuid_v2(b, 0)
    return "GPU-" + str(uuidlib.UUID(bytes=b.raw))


def main() -> None:
    kind, size = sys.argv[1], int(sys.argv[2])
    size -= size % CHUNK
    pattern = bytes((i * 2654435761 >> 13) & 0xFF for i in range(1 << 16)) * (CHUNK >> 16)
    if kind == "torch":
        torch = job_util.torch_cuda()
        host = torch.frombuffer(bytearray(pattern), dtype=torch.uint8)
        data = torch.empty(size, dtype=torch.uint8, device="cuda")
        for off in range(0, size, CHUNK):
            data[off:off + CHUNK].copy_(host)
            host[:8] = torch.tensor(list((off // CHUNK).to_bytes(8, "little")),
                                    dtype=torch.uint8)
        a = torch.arange(64 * 64, dtype=torch.float32, device="cuda").reshape(64, 64) / 4096

        def chunks():
            for off in range(0, size, CHUNK):
                yield data[off:off + CHUNK].cpu().numpy().tobytes()

        def result():
            return [round(float(v), 4) for v in (a @ a).sum(dim=0)[:4].cpu()]

        sync = torch.cuda.synchronize
    elif kind == "cupy":
        try:
            import cupy as cp
            import numpy as np
        except ImportError:
            job_util.fail("cupy not installed")
        host = np.frombuffer(bytearray(pattern), dtype=np.uint8).copy()
        data = cp.empty(size, dtype=cp.uint8)
        for off in range(0, size, CHUNK):
            data[off:off + CHUNK].set(host)
            host[:8] = np.frombuffer((off // CHUNK).to_bytes(8, "little"), dtype=np.uint8)
        a = cp.arange(64 * 64, dtype=cp.float32).reshape(64, 64) / 4096

        def chunks():
            for off in range(0, size, CHUNK):
                yield cp.asnumpy(data[off:off + CHUNK]).tobytes()

        def result():   # elementwise and a reduction: CuPy's own kernels
            return [round(float(v), 4) for v in cp.asnumpy((a * a + 1).sum(axis=0)[:4])]

        sync = cp.cuda.Device().synchronize
    else:
        job_util.fail(f"unknown kind {kind}")

    def digest() -> str:
        crc = 0
        for c in chunks():
            crc = zlib.crc32(c, crc)
        return f"{crc:08x}:{size}"

    sync()
    job_util.emit({"ready": digest(), "result": result(), "uuid": device_uuid(), "size": size})
    for line in sys.stdin:
        if line.strip() == "check":
            job_util.emit({"digest": digest(), "result": result(), "uuid": device_uuid()})


if __name__ == "__main__":
    main()
