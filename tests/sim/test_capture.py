"""Stream capture and graphs as NVIDIA's driver does them, through
cuda-bindings: host functions recorded (run at each launch, never during the
capture), what may not be done while a stream captures (its driver errors,
and the capture invalidated), streams forked into a capture by an event and
joined back, and the graph calls CUDA 13's runtime looks up (edges, clones,
child graphs, event nodes, updates, user objects, the DOT dump)."""

from __future__ import annotations

from support.sim import SPIN_ON_GPU0, run_py

SETUP = SPIN_ON_GPU0 + """\
GLOBAL = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
NON_BLOCKING = 1
calls = []
CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
cb = CB(lambda _: calls.append(1))
host_fn = cu.CUhostFn(ctypes.cast(cb, ctypes.c_void_p).value)
def status(s):
    return ck(cu.cuStreamIsCapturing(s)).name
"""


def test_a_host_function_is_recorded_and_runs_at_each_launch(sim_env):
    """cuLaunchHostFunc on a capturing stream adds a host node: it runs when
    the graph runs (twice for two launches), not while capturing."""
    out = run_py(sim_env, SETUP, """
        s = ck(cu.cuStreamCreate(NON_BLOCKING))
        ck(cu.cuStreamBeginCapture(s, GLOBAL))
        ck(spin(1_000_000, s))
        ck(cu.cuLaunchHostFunc(s, host_fn, 0))
        during = len(calls)
        g = ck(cu.cuStreamEndCapture(s))
        nodes = ck(cu.cuGraphGetNodes(g, 0))[1]
        ex = ck(cu.cuGraphInstantiate(g, 0))
        ck(cu.cuGraphLaunch(ex, s)); ck(cu.cuGraphLaunch(ex, s))
        ck(cu.cuStreamSynchronize(s))
        out({"during": during, "after": len(calls), "nodes": nodes})
    """)
    assert out == {"during": 0, "after": 2, "nodes": 2}


def test_synchronising_or_querying_a_capturing_stream_is_refused(sim_env):
    """Synchronising or querying a capturing stream, or its context, fails
    with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture:
    the stream's further work fails, cuStreamEndCapture ends it with
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph, and the stream works
    again afterwards. An event recorded in a capture can't be waited for."""
    out = run_py(sim_env, SETUP, """
        s = ck(cu.cuStreamCreate(NON_BLOCKING))
        res = {}
        for what, call in (("sync", lambda: cu.cuStreamSynchronize(s)),
                           ("query", lambda: cu.cuStreamQuery(s)),
                           ("ctx_sync", lambda: cu.cuCtxSynchronize())):
            ck(cu.cuStreamBeginCapture(s, GLOBAL))
            r = {"call": err(call()), "status": status(s), "launch": err(spin(1000, s))}
            end = cu.cuStreamEndCapture(s)
            r.update(end=err(end), graph=end[1] is None or int(end[1]) == 0,
                     then=status(s), sync=err(cu.cuStreamSynchronize(s)))
            res[what] = r
        e = ck(cu.cuEventCreate(0))
        ck(cu.cuStreamBeginCapture(s, GLOBAL))
        ck(spin(1000, s)); ck(cu.cuEventRecord(e, s))
        res["event"] = [err(cu.cuEventQuery(e)), err(cu.cuEventSynchronize(e))]
        ck(cu.cuStreamEndCapture(s))
        res["event_after"] = err(cu.cuEventQuery(e))
        out(res)
    """)
    for what in ("sync", "query", "ctx_sync"):
        assert out[what] == {
            "call": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            "status": "CU_STREAM_CAPTURE_STATUS_INVALIDATED",
            "launch": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            "end": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "graph": True,
            "then": "CU_STREAM_CAPTURE_STATUS_NONE", "sync": "CUDA_SUCCESS"}, what
    assert out["event"] == ["CUDA_ERROR_CAPTURED_EVENT"] * 2
    assert out["event_after"] == "CUDA_SUCCESS"


def test_a_stream_waiting_on_a_captured_event_joins_the_capture(sim_env):
    """Fork and join: a stream that waits on an event recorded in a capture
    captures too, its kernels depending on what the event stood for; joined
    back (the origin waits on its event), the graph holds both streams' work
    and ending the capture ends it for both. Not joined back:
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED. Ended from the joined stream:
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, which invalidates the capture."""
    out = run_py(sim_env, SETUP, """
        s1, s2 = ck(cu.cuStreamCreate(NON_BLOCKING)), ck(cu.cuStreamCreate(NON_BLOCKING))
        e1, e2 = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
        res = {}
        ck(cu.cuStreamBeginCapture(s1, GLOBAL))
        ck(spin(1000, s1)); ck(cu.cuEventRecord(e1, s1))
        ck(cu.cuStreamWaitEvent(s2, e1, 0))
        res["joined"] = status(s2)
        ck(spin(2000, s2)); ck(cu.cuEventRecord(e2, s2))
        ck(cu.cuStreamWaitEvent(s1, e2, 0))
        ck(spin(3000, s1))
        g = ck(cu.cuStreamEndCapture(s1))
        res["after"] = [status(s1), status(s2)]
        res["nodes"] = ck(cu.cuGraphGetNodes(g, 0))[1]
        res["edges"] = ck(cu.cuGraphGetEdges(g, 0))[-1]
        ex = ck(cu.cuGraphInstantiate(g, 0))
        ck(cu.cuGraphLaunch(ex, s1)); ck(cu.cuStreamSynchronize(s1))
        # not joined back
        ck(cu.cuStreamBeginCapture(s1, GLOBAL))
        ck(cu.cuEventRecord(e1, s1)); ck(cu.cuStreamWaitEvent(s2, e1, 0))
        ck(spin(1000, s2))
        res["unjoined"] = err(cu.cuStreamEndCapture(s1))
        res["unjoined_after"] = [status(s1), status(s2)]
        # ended from the stream that joined
        ck(cu.cuStreamBeginCapture(s1, GLOBAL))
        ck(cu.cuEventRecord(e1, s1)); ck(cu.cuStreamWaitEvent(s2, e1, 0))
        res["unmatched"] = err(cu.cuStreamEndCapture(s2))
        res["then"] = err(cu.cuStreamEndCapture(s1))
        # a wait on work outside the capture
        ck(cu.cuEventRecord(e2, s2))
        ck(cu.cuStreamBeginCapture(s1, GLOBAL))
        res["isolation"] = err(cu.cuStreamWaitEvent(s1, e2, 0))
        res["isolation_end"] = err(cu.cuStreamEndCapture(s1))
        out(res)
    """)
    assert out == {
        "joined": "CU_STREAM_CAPTURE_STATUS_ACTIVE",
        "after": ["CU_STREAM_CAPTURE_STATUS_NONE"] * 2, "nodes": 3, "edges": 3,
        "unjoined": "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
        "unjoined_after": ["CU_STREAM_CAPTURE_STATUS_NONE"] * 2,
        "unmatched": "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        "then": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "isolation": "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
        "isolation_end": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"}


def test_the_legacy_stream_is_refused_while_a_blocking_stream_captures(sim_env):
    """While a stream that synchronises with the legacy default stream
    captures, using the legacy stream is CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    asking whether it captures does not spoil the capture, launching on it
    does. A non-blocking stream's capture leaves the legacy stream alone."""
    out = run_py(sim_env, SETUP, """
        blocking, nb = ck(cu.cuStreamCreate(0)), ck(cu.cuStreamCreate(NON_BLOCKING))
        legacy = cu.CUstream(1)
        res = {}
        ck(cu.cuStreamBeginCapture(blocking, GLOBAL))
        res["ask"] = err(cu.cuStreamIsCapturing(legacy))
        res["ask_end"] = err(cu.cuStreamEndCapture(blocking))
        ck(cu.cuStreamBeginCapture(blocking, GLOBAL))
        res["launch"] = err(spin(1000, legacy))
        res["launch_end"] = err(cu.cuStreamEndCapture(blocking))
        ck(cu.cuStreamBeginCapture(nb, GLOBAL))
        res["nb"] = [err(cu.cuStreamIsCapturing(legacy)), err(spin(1000, legacy))]
        res["nb_end"] = err(cu.cuStreamEndCapture(nb))
        ck(cu.cuCtxSynchronize())
        out(res)
    """)
    assert out == {"ask": "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "ask_end": "CUDA_SUCCESS",
                   "launch": "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
                   "launch_end": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
                   "nb": ["CUDA_SUCCESS", "CUDA_SUCCESS"], "nb_end": "CUDA_SUCCESS"}


def test_graph_calls_the_runtime_looks_up(sim_env, tmp_path):
    """Edges, root nodes, clones, child graphs, event nodes, enabling nodes,
    updating an executable, user objects and the DOT dump, as CUDA 13's
    runtime reaches them (each was missing: cudaErrorCallRequiresNewerDriver)."""
    dot = tmp_path / "g.dot"
    out = run_py(sim_env, SETUP, f"""
        s = ck(cu.cuStreamCreate(NON_BLOCKING))
        def kparams(ns):
            p = cu.CUDA_KERNEL_NODE_PARAMS()
            p.func = fn
            p.gridDimX = p.gridDimY = p.gridDimZ = p.blockDimX = p.blockDimY = p.blockDimZ = 1
            p.kernelParams = ((ns,), (ctypes.c_uint64,))
            return p
        g = ck(cu.cuGraphCreate(0))
        a = ck(cu.cuGraphAddKernelNode(g, None, 0, kparams(2_000_000)))
        b = ck(cu.cuGraphAddKernelNode(g, None, 0, kparams(2_000_000)))
        ck(cu.cuGraphAddDependencies(g, [a], [b], None, 1))
        res = {{"edges": ck(cu.cuGraphGetEdges(g, 0))[-1],
               "roots": ck(cu.cuGraphGetRootNodes(g, 0))[-1],
               "deps_of_b": ck(cu.cuGraphNodeGetDependencies(b, 0))[-1],
               "dependents_of_a": ck(cu.cuGraphNodeGetDependentNodes(a, 0))[-1]}}
        clone = ck(cu.cuGraphClone(g))
        res["found"] = int(ck(cu.cuGraphNodeFindInClone(a, clone))) != int(a)
        parent = ck(cu.cuGraphCreate(0))
        child = ck(cu.cuGraphAddChildGraphNode(parent, None, 0, g))
        ev = ck(cu.cuEventCreate(0))
        rec = ck(cu.cuGraphAddEventRecordNode(parent, [child], 1, ev))
        res["event_node"] = int(ck(cu.cuGraphEventRecordNodeGetEvent(rec))) == int(ev)
        ex = ck(cu.cuGraphInstantiate(parent, 0))
        t0, t1 = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
        ck(cu.cuEventRecord(t0, s)); ck(cu.cuGraphLaunch(ex, s)); ck(cu.cuEventRecord(t1, s))
        ck(cu.cuEventSynchronize(t1)); ck(cu.cuEventSynchronize(ev))
        res["ms"] = round(ck(cu.cuEventElapsedTime(t0, t1)))
        ex2 = ck(cu.cuGraphInstantiate(g, 0))
        ck(cu.cuGraphNodeSetEnabled(ex2, b, 0))
        res["enabled"] = ck(cu.cuGraphNodeGetEnabled(ex2, b))
        ck(cu.cuEventRecord(t0, s)); ck(cu.cuGraphLaunch(ex2, s)); ck(cu.cuEventRecord(t1, s))
        ck(cu.cuEventSynchronize(t1))
        res["ms_one_disabled"] = round(ck(cu.cuEventElapsedTime(t0, t1)))
        res["update"] = err(cu.cuGraphExecUpdate(ex2, clone))
        res["update_other_shape"] = err(cu.cuGraphExecUpdate(ex2, parent))
        ck(cu.cuGraphDebugDotPrint(g, b"{dot}", 0))
        out(res)
    """)
    assert out == {"edges": 1, "roots": 1, "deps_of_b": 1, "dependents_of_a": 1,
                   "found": True, "event_node": True, "ms": 4, "enabled": 0,
                   "ms_one_disabled": 2, "update": "CUDA_SUCCESS",
                   "update_other_shape": "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"}
    text = dot.read_text()
    assert text.startswith("digraph") and text.count("vgpu_spin") == 2 and "->" in text
