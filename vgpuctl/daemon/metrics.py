"""The Prometheus endpoint: the node's GPUs and jobs as metrics.

Optional: it needs prometheus-client (``pip install 'vgpuctl[metrics]'``) and
a ``metrics_address`` in the config. The daemon publishes an immutable
``Snapshot`` every tick (``SnapshotBox.set``); the HTTP server runs in its own
thread and the collector turns the latest snapshot into metrics at each
scrape, so a scrape never touches the daemon's live state.

Metrics (one ``vgpu_`` prefix, base units, ratios 0 to 1):

    vgpu_gpu_memory_used_bytes{gpu,uuid,name}          gauge
    vgpu_gpu_memory_total_bytes{gpu,uuid,name}         gauge
    vgpu_gpu_utilization_ratio{gpu,uuid,name}          gauge (when sampled)
    vgpu_gpu_compute_promised_ratio{gpu,uuid,name}     gauge (shares promised to its jobs)
    A job has one series per GPU it holds (gpu, uuid); ``sum by (job)``
    gives its totals.
    vgpu_job_memory_used_bytes{job,name,user,gpu,uuid}   gauge
    vgpu_job_memory_limit_bytes{job,name,user,gpu,uuid}  gauge
    vgpu_job_compute_share_target_ratio{...}           gauge
    vgpu_job_compute_share_measured_ratio{...}         gauge
    vgpu_job_priority{...}                             gauge (0 low, 1 normal, 2 high)
    vgpu_job_throttled_seconds_total{...}              counter
    vgpu_job_gpu_seconds_total{...}                    counter (when accounted)
    vgpu_job_violations_total{...}                     counter (on its first GPU's series)
    vgpu_job_suspended{...}                            gauge (1 while suspended)
    vgpu_job_suspended_seconds_total{...}              counter
    vgpu_violations_total{kind}                        counter (memory, compute, no_job)
    vgpu_jobs_running                                  gauge (suspended ones aside)
    vgpu_jobs_suspended                                gauge
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vgpuctl.errors import MetricsUnavailable

if TYPE_CHECKING:
    from vgpuctl.core.job import GpuPart, GpuView, JobView

log = logging.getLogger(__name__)

PREFIX = "vgpu_"
PRIORITY_VALUES = {"low": 0, "normal": 1, "high": 2}
INSTALL_HINT = "pip install 'vgpuctl[metrics]'"


@dataclass(frozen=True)
class GpuMetrics:
    uuid: str
    index: int
    name: str = ""
    memory_used: int = 0       # bytes
    memory_total: int = 0      # bytes
    utilization: float | None = None  # 0..1, None when not sampled
    compute_promised: float = 0.0     # 0..1 (more with core_oversubscribe)


@dataclass(frozen=True)
class JobMetrics:
    """One job on one GPU."""

    job_id: str
    gpu_uuid: str
    gpu_index: int
    name: str = ""
    user: str = ""
    memory_used: int = 0        # bytes
    memory_limit: int = 0       # bytes, 0 = none
    share_target: float = 1.0   # 0..1
    share_measured: float = 0.0  # 0..1
    throttled_seconds: float = 0.0  # since the job started
    gpu_seconds: float | None = None  # since the job started, when accounted
    violations: int = 0         # violations found since the job started
    priority: int = 1           # 0 low, 1 normal, 2 high
    suspended: bool = False     # its processes are checkpointed (docs/suspend.md)
    suspended_seconds: float = 0.0  # in all, since the job started


@dataclass(frozen=True)
class Snapshot:
    gpus: Sequence[GpuMetrics] = ()
    jobs: Sequence[JobMetrics] = ()
    jobs_running: int | None = None  # None: the distinct job ids in jobs
    jobs_suspended: int = 0
    violations: Mapping[str, int] = field(default_factory=dict)  # kind -> found since start


class SnapshotBox:
    """The latest snapshot, swapped whole by the daemon and read by scrapes
    (one reference: no lock needed)."""

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self._snap = snapshot or Snapshot()

    def set(self, snapshot: Snapshot) -> None:
        self._snap = snapshot

    def get(self) -> Snapshot:
        return self._snap

    __call__ = get


def snapshot(gpus: Sequence[GpuView],
             jobs: Sequence[tuple[JobView, Sequence[GpuPart], int]],
             gpu_seconds: Callable[[str, str], float | None],
             violations: Mapping[str, int]) -> Snapshot:
    """A snapshot from the model's views (vgpuctl.core.job): the GPUs, and
    each live job (its view, its typed part on each of its GPUs and the
    count of its violations) on each of its GPUs; gpu_seconds(job id, GPU
    UUID) is what accounting has of it there (None: no accounting). A job's
    totals are the sums over its GPUs' series (``sum by (job)``)."""
    gs = [GpuMetrics(uuid=g.uuid, index=g.index, name=g.name,
                     memory_used=g.memory_used or 0, memory_total=g.memory_total,
                     utilization=None if g.utilization is None else g.utilization / 100,
                     compute_promised=g.core_promised / 100)
          for g in gpus]
    js = [JobMetrics(job_id=v.id, gpu_uuid=p.uuid, gpu_index=p.index or 0,
                     name=v.name, user=v.user, memory_used=p.mem_used or 0,
                     memory_limit=p.mem_limit or 0,
                     share_target=(p.core or 0) / 100,
                     share_measured=p.core_measured or 0.0,
                     throttled_seconds=p.throttled_s or 0.0,
                     gpu_seconds=gpu_seconds(v.id, p.uuid),
                     violations=count if i == 0 else 0,
                     priority=PRIORITY_VALUES.get(v.priority, 1),
                     suspended=v.state == "suspended",
                     suspended_seconds=(v.suspended_s or 0.0) if i == 0 else 0.0)
          for v, parts, count in jobs for i, p in enumerate(parts)]
    suspended = sum(1 for v, _, _ in jobs if v.state == "suspended")
    return Snapshot(gpus=gs, jobs=js, jobs_running=len(jobs) - suspended,
                    jobs_suspended=suspended, violations=dict(violations))


def available() -> bool:
    """Whether prometheus-client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def _ratio(x: float) -> float:
    return min(max(float(x), 0.0), 1.0)


# The metrics with a series per GPU and per job on a GPU: each one's family
# (gauge or counter), name, help and value for one series (None: no sample).
_GPU_METRICS: tuple[tuple[str, str, str, Callable[[GpuMetrics], float | None]], ...] = (
    ("gauge", "gpu_memory_used_bytes", "GPU memory in use, all processes",
     lambda g: float(g.memory_used)),
    ("gauge", "gpu_memory_total_bytes", "GPU memory in total",
     lambda g: float(g.memory_total)),
    ("gauge", "gpu_utilization_ratio", "Fraction of time a kernel ran on the GPU (NVML)",
     lambda g: None if g.utilization is None else _ratio(g.utilization)),
    ("gauge", "gpu_compute_promised_ratio",
     "Compute promised to the GPU's normal and high jobs (the shares they asked for)",
     lambda g: max(0.0, float(g.compute_promised))),
)
_JOB_METRICS: tuple[tuple[str, str, str, Callable[[JobMetrics], float | None]], ...] = (
    ("gauge", "job_memory_used_bytes", "GPU memory the job holds on this GPU",
     lambda j: float(j.memory_used)),
    ("gauge", "job_memory_limit_bytes", "The job's memory limit on this GPU (0: none)",
     lambda j: float(j.memory_limit)),
    ("gauge", "job_compute_share_target_ratio", "The job's compute share (--core), 0 to 1",
     lambda j: _ratio(j.share_target)),
    ("gauge", "job_compute_share_measured_ratio",
     "The compute share the job used over the last tick, 0 to 1",
     lambda j: _ratio(j.share_measured)),
    ("counter", "job_throttled_seconds", "Time the job's launching threads waited for tokens",
     lambda j: max(0.0, float(j.throttled_seconds))),
    ("counter", "job_gpu_seconds", "GPU time the job used (integral of its measured share)",
     lambda j: None if j.gpu_seconds is None else max(0.0, float(j.gpu_seconds))),
    ("counter", "job_violations", "Violations found of the job (NVML against its limits)",
     lambda j: float(j.violations)),
    ("gauge", "job_priority", "The job's priority class: 0 low, 1 normal, 2 high",
     lambda j: float(j.priority)),
    ("gauge", "job_suspended",
     "1 while the job is suspended (its processes checkpointed, no GPU memory held)",
     lambda j: 1.0 if j.suspended else 0.0),
    ("counter", "job_suspended_seconds", "Time the job was suspended (not billed)",
     lambda j: max(0.0, float(j.suspended_seconds))),
)


def _families(table: Sequence[tuple[str, str, str, Callable[[Any], float | None]]],
              labels: list[str], rows: Sequence[Any],
              label_values: Callable[[Any], list[str]]) -> Iterator[Any]:
    """One family a row of the table, with a series for each of rows."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
    for kind, name, help_text, value in table:
        family = kinds[kind](PREFIX + name, help_text, labels=labels)
        for row in rows:
            v = value(row)
            if v is not None:
                family.add_metric(label_values(row), v)
        yield family


class Collector:
    """A prometheus-client collector over a snapshot callable."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[Any]:
        # Nothing up front: the registry then doesn't call collect() at
        # registration time, before the daemon has a snapshot.
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self._snapshot()
        yield from _families(_GPU_METRICS, ["gpu", "uuid", "name"], snap.gpus,
                             lambda g: [str(g.index), g.uuid, g.name])
        yield from _families(_JOB_METRICS, ["job", "name", "user", "gpu", "uuid"], snap.jobs,
                             lambda j: [j.job_id, j.name, j.user, str(j.gpu_index), j.gpu_uuid])
        viol = CounterMetricFamily(PREFIX + "violations",
                                   "Violations found by kind: memory, compute, no_job "
                                   "(a GPU process in no job)", labels=["kind"])
        for kind, n in sorted(snap.violations.items()):
            viol.add_metric([kind], float(n))
        yield viol

        running = (snap.jobs_running if snap.jobs_running is not None
                   else len({j.job_id for j in snap.jobs}))
        jr = GaugeMetricFamily(PREFIX + "jobs_running", "Jobs running on this node")
        jr.add_metric([], float(running))
        yield jr
        js = GaugeMetricFamily(PREFIX + "jobs_suspended", "Jobs suspended on this node")
        js.add_metric([], float(snap.jobs_suspended))
        yield js


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (every interface) into
    (host, port); MetricsUnavailable when malformed."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise MetricsUnavailable(f"metrics_address {address!r}: expected HOST:PORT, "
                                 "for example 127.0.0.1:9400")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


class MetricsServer:
    """The HTTP endpoint (``/metrics``, any path answers) in a daemon thread."""

    def __init__(self, snapshot: Callable[[], Snapshot], address: str) -> None:
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
        except ImportError:
            raise MetricsUnavailable(
                f"metrics_address is {address!r} but prometheus-client is not installed: "
                f"{INSTALL_HINT}") from None
        from socketserver import ThreadingMixIn
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        host, port = parse_address(address)
        family = socket.AF_INET
        try:
            if ipaddress.ip_address(host).version == 6:
                family = socket.AF_INET6
        except ValueError:
            pass  # a host name: IPv4

        class _Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = family

        class _Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(Collector(snapshot))
        app = make_wsgi_app(self.registry)
        try:
            self._httpd = make_server(host, port, app, _Server, handler_class=_Quiet)
        except OSError as e:
            raise MetricsUnavailable(f"metrics_address {address!r}: {e.strerror}") from None
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="vgpu-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/metrics"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve(address: str, snapshot: Callable[[], Snapshot],
          logger: logging.Logger | None = None) -> MetricsServer | None:
    """Start the endpoint when ``address`` is set. On any problem (no
    prometheus-client, address in use) log one clear error and return None:
    the daemon runs on without metrics."""
    if not address:
        return None
    lg = logger or log
    try:
        server = MetricsServer(snapshot, address)
    except MetricsUnavailable as e:
        lg.error("metrics disabled: %s", e)
        return None
    lg.info("metrics on %s", server.url)
    return server
