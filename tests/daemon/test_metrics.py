"""The Prometheus endpoint, scraped over HTTP: names, units, values."""

from __future__ import annotations

import logging
import socket
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from support.daemon import needs_native

from vgpuctl.daemon import metrics
from vgpuctl.daemon.metrics import GpuMetrics, JobMetrics, MetricsServer, Snapshot, SnapshotBox
from vgpuctl.errors import MetricsUnavailable

G = 1 << 30
GPU0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"

SNAP = Snapshot(
    gpus=[GpuMetrics(GPU0, 0, "Simulated GPU", memory_used=5 * G, memory_total=16 * G,
                     utilization=0.75)],
    jobs=[
        JobMetrics("1", GPU0, 0, name="train", user="alice", memory_used=3 * G,
                   memory_limit=4 * G, share_target=0.3, share_measured=0.29,
                   throttled_seconds=12.5, gpu_seconds=100.0),
        JobMetrics("2", GPU0, 0, name="eval", user="bob", memory_used=G,
                   memory_limit=2 * G, share_target=0.5, share_measured=1.7,
                   throttled_seconds=0.0),
    ],
)


def scrape(server: MetricsServer) -> dict[str, dict[tuple, float]]:
    with urllib.request.urlopen(server.url, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture
def server():
    box = SnapshotBox(SNAP)
    srv = MetricsServer(box, "127.0.0.1:0")
    yield srv, box
    srv.stop()


def one(samples, **labels):
    for k, v in samples.items():
        if all((name, val) in k for name, val in labels.items()):
            return v
    raise KeyError(labels)


def test_scrape_names_units_and_values(server):
    srv, _ = server
    m = scrape(srv)
    assert all(name.startswith("vgpu_") for name in m)
    gl = {"gpu": "0", "uuid": GPU0}
    assert one(m["vgpu_gpu_memory_used_bytes"], **gl) == 5 * G
    assert one(m["vgpu_gpu_memory_total_bytes"], **gl) == 16 * G
    assert one(m["vgpu_gpu_utilization_ratio"], **gl) == 0.75
    jl = {"job": "1", "user": "alice", "name": "train", "uuid": GPU0}
    assert one(m["vgpu_job_memory_used_bytes"], **jl) == 3 * G
    assert one(m["vgpu_job_memory_limit_bytes"], **jl) == 4 * G
    assert one(m["vgpu_job_compute_share_target_ratio"], **jl) == pytest.approx(0.3)
    assert one(m["vgpu_job_compute_share_measured_ratio"], **jl) == pytest.approx(0.29)
    assert one(m["vgpu_job_throttled_seconds_total"], **jl) == 12.5
    assert one(m["vgpu_job_gpu_seconds_total"], **jl) == 100.0
    # Ratios stay within 0..1 whatever the sampler says.
    assert one(m["vgpu_job_compute_share_measured_ratio"], job="2") == 1.0
    assert m["vgpu_jobs_running"][()] == 2


def test_counters_end_in_total_and_gauges_do_not(server):
    srv, _ = server
    with urllib.request.urlopen(srv.url, timeout=10) as r:
        text = r.read().decode()
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    for name, kind in types.items():
        assert name.startswith("vgpu_")
        if kind == "counter":
            assert name.endswith(("_seconds", "_total")), name
        else:
            assert kind == "gauge" and not name.endswith("_total"), name
    assert "vgpu_job_throttled_seconds_total{" in text


def test_scrape_sees_the_latest_snapshot(server):
    srv, box = server
    box.set(Snapshot(gpus=SNAP.gpus, jobs=[], jobs_running=0))
    m = scrape(srv)
    assert m["vgpu_jobs_running"][()] == 0
    assert "vgpu_job_memory_used_bytes" not in m


def test_missing_prometheus_client_logs_one_error(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    assert not metrics.available()
    with caplog.at_level(logging.ERROR):
        assert metrics.serve("127.0.0.1:0", SnapshotBox()) is None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "vgpuctl[metrics]" in errors[0].getMessage()


def test_address_in_use_logs_and_runs_on(caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with caplog.at_level(logging.ERROR):
            assert metrics.serve(f"127.0.0.1:{port}", SnapshotBox()) is None
    assert any("metrics disabled" in r.getMessage() for r in caplog.records)


def test_no_address_no_server():
    assert metrics.serve("", SnapshotBox()) is None


@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:9400", ("127.0.0.1", 9400)),
    (":9400", ("0.0.0.0", 9400)),
    ("[::1]:9400", ("::1", 9400)),
    ("localhost:1", ("localhost", 1)),
])
def test_parse_address(text, expected):
    assert metrics.parse_address(text) == expected


@pytest.mark.parametrize("text", ["9400", "host:", "host:http", "h:70000"])
def test_parse_address_rejects(text):
    with pytest.raises(MetricsUnavailable):
        metrics.parse_address(text)


# -- the daemon's endpoint ---------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_native
def test_daemon_serves_metrics_of_a_running_job():
    import time

    from vgpuctl.ops.showcase import Demo, DemoJob

    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    job = DemoJob("scraped", "1G", 30, "hard", 1000)
    with Demo(seconds=30, jobs=(job,), config=f'metrics_address = "127.0.0.1:{port}"\n') as d:
        d.start_daemon()
        d.start_jobs()
        deadline = time.monotonic() + 20
        m: dict = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url, timeout=10) as r:
                text = r.read().decode()
            m = {}
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    m.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
            gs = m.get("vgpu_job_gpu_seconds_total", {})
            if m.get("vgpu_jobs_running", {}).get(()) == 1 and gs and max(gs.values()) > 0.5:
                break
            time.sleep(0.2)
        assert m["vgpu_jobs_running"][()] == 1
        assert one(m["vgpu_gpu_memory_total_bytes"], gpu="0") == 16 * G
        jl = {"name": "scraped"}
        assert one(m["vgpu_job_memory_limit_bytes"], **jl) == G
        assert one(m["vgpu_job_memory_used_bytes"], **jl) > 0         # its context
        assert one(m["vgpu_job_compute_share_target_ratio"], **jl) == pytest.approx(0.3)
        assert 0.15 <= one(m["vgpu_job_compute_share_measured_ratio"], **jl) <= 0.45
        assert one(m["vgpu_job_throttled_seconds_total"], **jl) > 0    # a 30 % gate waits
        assert one(m["vgpu_job_gpu_seconds_total"], **jl) > 0.5


def test_a_suspended_job_is_counted_as_such():
    """The snapshot from the views: a suspended job is in the jobs suspended,
    not the ones running, with its time suspended."""
    from vgpuctl.core.job import GpuPart, JobView

    on = [GpuPart(index=0, uuid=GPU0, mem_limit=G, core=100)]
    wire = [p.wire() for p in on]
    views = [JobView(id="1", name="a", user="u", state="running", gpu=0, gpu_uuid=GPU0,
                     mem_limit=G, core=100, per_gpu=wire),
             JobView(id="2", name="b", user="u", state="suspended", gpu=0, gpu_uuid=GPU0,
                     mem_limit=G, core=100, suspended_s=12.5, per_gpu=wire)]
    snap = metrics.snapshot([], [(v, on, 0) for v in views], lambda j, u: None, {})
    assert (snap.jobs_running, snap.jobs_suspended) == (1, 1)
    box = SnapshotBox(snap)
    srv = MetricsServer(box, "127.0.0.1:0")
    try:
        m = scrape(srv)
    finally:
        srv.stop()
    assert one(m["vgpu_job_suspended"], job="2") == 1.0
    assert one(m["vgpu_job_suspended"], job="1") == 0.0
    assert one(m["vgpu_job_suspended_seconds_total"], job="2") == 12.5
    assert m["vgpu_jobs_suspended"][()] == 1 and m["vgpu_jobs_running"][()] == 1
