"""CUDA IPC on the simulated GPU, through cuda-bindings: one process exports
device memory and an event, another opens them, sees the same bytes both
ways, and waits for work the first queued; and the errors of the driver
(what can't be exported, a process opening its own handle, a handle whose
exporter is gone)."""

from __future__ import annotations

import json

from support.sim import SPIN_ON_GPU0, holding, run_py

SETUP = SPIN_ON_GPU0 + """\
IPC_EVENT = cu.CUevent_flags.CU_EVENT_INTERPROCESS | cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
LAZY = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
def handle(hexed, kind):
    h = kind()
    ctypes.memmove(h.getPtr(), bytes.fromhex(hexed), 64)
    return h
def hexed(h):
    return ctypes.string_at(h.getPtr(), 64).hex()
"""

# Exports 1 MiB holding 0..255 repeated, and an interprocess event recorded
# behind a host function that holds its queue until told to go on; then,
# when told again, reads the first bytes back.
EXPORTER = """
import threading
gate = threading.Event()
HOLD = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: gate.wait())
p = ck(cu.cuMemAlloc(1 << 20))
data = bytes(range(256)) * 4096
ck(cu.cuMemcpyHtoD(p, data, len(data)))
mh = ck(cu.cuIpcGetMemHandle(p))
ev = ck(cu.cuEventCreate(IPC_EVENT))
eh = ck(cu.cuIpcGetEventHandle(ev))
res = {"mem": hexed(mh), "event": hexed(eh),
       "own": err(cu.cuIpcOpenMemHandle(mh, LAZY)),
       "own_event": err(cu.cuIpcOpenEventHandle(eh))}
pool_p = ck(cu.cuMemAllocAsync(4096, 0))
res["pool"] = err(cu.cuIpcGetMemHandle(pool_p))
res["timing_event"] = err(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_INTERPROCESS))
plain = ck(cu.cuEventCreate(0))
res["plain_event"] = err(cu.cuIpcGetEventHandle(plain))
ck(spin(1_000_000))
ck(cu.cuLaunchHostFunc(0, cu.CUhostFn(ctypes.cast(HOLD, ctypes.c_void_p).value), 0))
ck(cu.cuEventRecord(ev, 0))
out(res)
sys.stdin.readline()
gate.set()
sys.stdin.readline()
back = bytearray(4)
ck(cu.cuMemcpyDtoH(back, p, 4))
out(list(back))
"""


def test_memory_and_an_event_are_shared_between_processes(sim_env):
    """The importer maps the exporter's memory (the same bytes, writes seen
    both ways; a second open counts a reference), and sees the exporter's
    event: not ready while the exporter's queue is held, and a stream of the
    importer that waits on it runs once the exporter's work is done."""
    with holding(sim_env, SETUP, EXPORTER) as ex, holding(sim_env, SETUP, f"""
            mh = handle({ex.report["mem"]!r}, cu.CUipcMemHandle)
            eh = handle({ex.report["event"]!r}, cu.CUipcEventHandle)
            p = ck(cu.cuIpcOpenMemHandle(mh, LAZY))
            again = ck(cu.cuIpcOpenMemHandle(mh, LAZY))
            buf = bytearray(512)
            ck(cu.cuMemcpyDtoH(buf, p, 512))
            ck(cu.cuMemcpyHtoD(p, b"\\x07\\x08\\x09\\x0a", 4))
            ev = ck(cu.cuIpcOpenEventHandle(eh))
            out({{"same": int(p) == int(again), "bytes": bytes(buf) == bytes(range(256)) * 2,
                 "range": ck(cu.cuMemGetAddressRange(p))[1],
                 "query": err(cu.cuEventQuery(ev))}})
            sys.stdin.readline()
            s = ck(cu.cuStreamCreate(1))
            ck(cu.cuStreamWaitEvent(s, ev, 0))
            ck(cu.cuStreamSynchronize(s))
            res = {{"after": err(cu.cuEventQuery(ev))}}
            ck(cu.cuEventSynchronize(ev))
            res["closes"] = [err(cu.cuIpcCloseMemHandle(p)) for _ in range(3)]
            out(res)
            """) as im:
        first = im.report
        ex.proc.stdin.write("\n")      # the exporter's queue goes on
        ex.proc.stdin.flush()
        im.proc.stdin.write("\n")      # the importer waits for its event
        im.proc.stdin.flush()
        second = json.loads(im.proc.stdout.readline())
        ex.proc.stdin.write("\n")      # the exporter reads its bytes back
        ex.proc.stdin.flush()
        back = json.loads(ex.proc.stdout.readline())
        im.stop()
        ex.stop()
    assert ex.report["own"] == "CUDA_ERROR_INVALID_CONTEXT"
    assert ex.report["own_event"] == "CUDA_ERROR_INVALID_CONTEXT"
    assert ex.report["pool"] == "CUDA_ERROR_INVALID_VALUE"
    assert ex.report["timing_event"] == "CUDA_ERROR_INVALID_VALUE"
    assert ex.report["plain_event"] == "CUDA_ERROR_INVALID_VALUE"
    assert first == {"same": True, "bytes": True, "range": 1 << 20,
                     "query": "CUDA_ERROR_NOT_READY"}
    assert second == {"after": "CUDA_SUCCESS",
                      "closes": ["CUDA_SUCCESS", "CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE"]}
    assert back == [7, 8, 9, 10]


def test_a_handle_whose_exporter_is_gone_is_refused(sim_env):
    """A well-formed handle of a process that has exited:
    CUDA_ERROR_INVALID_HANDLE; a handle that is not one:
    CUDA_ERROR_INVALID_VALUE."""
    with holding(sim_env, SETUP, EXPORTER) as ex:
        mem = ex.report["mem"]
        ex.kill()
    got = run_py(sim_env, SETUP, f"""
        out([err(cu.cuIpcOpenMemHandle(handle({mem!r}, cu.CUipcMemHandle), LAZY)),
             err(cu.cuIpcOpenMemHandle(cu.CUipcMemHandle(), LAZY))])
    """)
    assert got == ["CUDA_ERROR_INVALID_HANDLE", "CUDA_ERROR_INVALID_VALUE"]
