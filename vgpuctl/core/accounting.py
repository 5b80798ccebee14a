"""Usage accounting: how much GPU time and memory each job used, over time.

The daemon calls ``Accountant.observe`` once per tick for every (job, GPU)
with the job's measured compute share on that GPU (0..1) and the bytes it
holds there. The accountant integrates

    GPU time      sum of share x dt                 in GPU-seconds
    memory time   integral of used bytes over time  in GiB-hours
    peak memory   highest used (or peak) bytes seen

and keeps the sums of the current interval in memory. ``flush(conn)`` writes
them to the ``usage`` table of the daemon's SQLite file, about every two
seconds, so a crash loses at most the samples since the last flush. Each row
covers one interval [t0, t1) of one job on one GPU; a row grows by UPDATE until
it spans ``row_seconds``, then a new one starts, which keeps the table small
(one row per job and GPU per five minutes) while reports can still clip rows to
a time window. A restarted daemon starts new rows for the same job ids, so the
records of a job simply continue.

Times are wall-clock seconds since the epoch (``time.time()``): reports are
asked for in dates. A step backwards of the clock, or a gap longer than
``max_gap`` (the daemon was stopped or stalled), starts integrating afresh
from the next sample instead of guessing what happened in between.

No I/O apart from ``flush`` and ``create_schema``; the arithmetic is plain.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field

GIB = 1 << 30

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY,
    job_id TEXT NOT NULL,
    gpu_uuid TEXT NOT NULL,
    t0 REAL NOT NULL,
    t1 REAL NOT NULL,
    gpu_seconds REAL NOT NULL DEFAULT 0,
    mem_gib_hours REAL NOT NULL DEFAULT 0,
    peak_mem_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_job ON usage (job_id);
CREATE INDEX IF NOT EXISTS usage_t1 ON usage (t1);
"""


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the usage table and its indexes if they are missing (idempotent)."""
    conn.executescript(SCHEMA)


@dataclass(frozen=True)
class UsageRow:
    """One interval of one job on one GPU, as stored in the usage table."""

    job_id: str
    gpu_uuid: str
    t0: float
    t1: float
    gpu_seconds: float
    mem_gib_hours: float
    peak_mem_bytes: int


@dataclass
class _Open:
    """The running sums of one (job, GPU) since its row started."""

    t0: float                 # start of the current row
    t1: float                 # time of the last sample integrated
    last_mem: int             # bytes at the last sample
    last_share: float = 0.0   # share at the last sample
    gpu_seconds: float = 0.0  # in the current row, flushed or not
    mem_gib_hours: float = 0.0
    peak: int = 0
    row_id: int | None = None  # the row in the table, once written
    dirty: bool = True         # changed since the last flush


@dataclass
class Accountant:
    """Integrates per-job GPU time and memory time; see the module docstring.

    flush_seconds  how often ``maybe_flush`` writes (a crash loses at most this)
    row_seconds    a row spans at most this long before a new one starts
    max_gap        a longer gap between two samples is not integrated
    """

    flush_seconds: float = 2.0
    row_seconds: float = 300.0
    max_gap: float = 30.0
    _open: dict[tuple[str, str], _Open] = field(default_factory=dict, repr=False)
    _ended: set[tuple[str, str]] = field(default_factory=set, repr=False)
    _closed: list[tuple[tuple[str, str], _Open]] = field(default_factory=list, repr=False)
    _total: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)
    _last_flush: float | None = field(default=None, repr=False)

    # -- samples ----------------------------------------------------------------
    def observe(self, job_id: str, gpu_uuid: str, now: float, share: float,
                mem_used_bytes: int, peak_bytes: int | None = None) -> None:
        """One sample: over the time since the previous sample of this job on
        this GPU, the job used ``share`` (0..1, measured over that time) of the
        GPU's compute and now holds ``mem_used_bytes``. ``peak_bytes``, when the
        hook's high-water mark is known, also feeds the peak."""
        key = (job_id, gpu_uuid)
        share = min(max(float(share), 0.0), 1.0)
        mem = max(int(mem_used_bytes), 0)
        peak = max(mem, int(peak_bytes or 0))
        cur = self._open.get(key)
        if cur is None:
            # The first sample only sets the baseline: nothing to integrate yet.
            self._open[key] = _Open(t0=now, t1=now, last_mem=mem, peak=peak)
            return
        dt = now - cur.t1
        if dt < 0 or dt > self.max_gap:
            # The clock stepped back, or the daemon was away: don't invent
            # the usage in between; continue from here in a new row.
            self._roll(key, cur, now, mem, peak)
            return
        if cur.row_id is not None and now - cur.t0 > self.row_seconds:
            cur = self._roll(key, cur, cur.t1, cur.last_mem, 0, cur.last_share)
        cur.gpu_seconds += share * dt
        self._total[key] = self._total.get(key, 0.0) + share * dt
        # Memory changes somewhere between the two samples: the trapezoid.
        cur.mem_gib_hours += (cur.last_mem + mem) / 2 / GIB * dt / 3600.0
        cur.t1 = now
        cur.last_mem = mem
        cur.last_share = share
        cur.peak = max(cur.peak, peak)
        cur.dirty = True

    def _roll(self, key: tuple[str, str], old: _Open, t0: float, mem: int,
              peak: int, share: float = 0.0) -> _Open:
        """Close ``old`` (the next flush writes its last sums) and open a
        fresh row for ``key`` starting at ``t0``."""
        if old.dirty and (old.t1 > old.t0 or old.row_id is not None or old.peak):
            self._closed.append(_snapshot(key, old))
        new = _Open(t0=t0, t1=t0, last_mem=mem, last_share=share, peak=max(peak, mem))
        self._open[key] = new
        return new

    def end_job(self, job_id: str, now: float | None = None, lag_s: float = 0.0) -> None:
        """The job ended (at ``now``): its rows are written by the next flush,
        then forgotten.

        A measured share arrives late: it describes the sampler's last
        window, which closes up to one sample period after the work was
        done, so the integral of the shares trails the real use by about
        ``lag_s`` (the sampler's period) and the job's last moments are never
        measured. The last measured share stands in for them: from the last
        sample to ``now``, plus ``lag_s``."""
        for key, o in list(self._open.items()):
            if key[0] != job_id:
                continue
            self._ended.add(key)
            if now is None:
                continue
            tail = min(max(now - o.t1, 0.0), self.max_gap)
            extra = o.last_share * (tail + max(lag_s, 0.0))
            if extra > 0 or tail > 0:
                o.gpu_seconds += extra
                self._total[key] = self._total.get(key, 0.0) + extra
                o.mem_gib_hours += o.last_mem / GIB * tail / 3600.0
                o.t1 = max(o.t1, now)
                o.dirty = True

    def jobs(self) -> set[str]:
        """Job ids with samples in memory."""
        return {k[0] for k in self._open}

    def totals(self, job_id: str) -> tuple[float, float, int]:
        """(GPU-seconds since the job started, all GPUs summed, as
        ``gpu_seconds``; GiB-hours and peak bytes of its current rows). For
        live views."""
        gs = sum(v for (jid, _), v in self._total.items() if jid == job_id)
        gh = 0.0
        pk = 0
        for (jid, _), o in self._open.items():
            if jid == job_id:
                gh += o.mem_gib_hours
                pk = max(pk, o.peak)
        return gs, gh, pk

    def gpu_seconds(self, job_id: str, gpu_uuid: str) -> float:
        """GPU-seconds of the job on that GPU since it started: what earlier
        daemons recorded (``seed``) plus what this one integrated. A counter
        for the metrics endpoint."""
        return self._total.get((job_id, gpu_uuid), 0.0)

    def seed(self, conn: sqlite3.Connection, job_ids: Iterable[str]) -> None:
        """At start, before the first sample: take the GPU-seconds already
        recorded for these (re-adopted) jobs, so ``gpu_seconds`` counts from
        each job's start rather than from this daemon's."""
        ids = [str(j) for j in job_ids]
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ", ".join("?" * len(chunk))
            try:
                rows = conn.execute(
                    f"SELECT job_id, gpu_uuid, SUM(gpu_seconds) FROM usage"
                    f" WHERE job_id IN ({marks}) GROUP BY job_id, gpu_uuid", chunk).fetchall()
            except sqlite3.OperationalError:
                return
            for jid, gpu, total in rows:
                key = (str(jid), str(gpu))
                self._total[key] = self._total.get(key, 0.0) + float(total or 0.0)

    # -- persistence --------------------------------------------------------
    def flush_due(self, now: float) -> bool:
        return self._last_flush is None or now - self._last_flush >= self.flush_seconds

    def maybe_flush(self, conn: sqlite3.Connection, now: float) -> bool:
        """Flush when ``flush_seconds`` have passed since the last flush.
        Returns True when it wrote."""
        if not self.flush_due(now):
            return False
        self.flush(conn)
        self._last_flush = now
        return True

    def flush(self, conn: sqlite3.Connection) -> int:
        """Write every changed interval to the usage table in one transaction;
        returns the number of rows inserted or updated. Jobs ended with
        ``end_job`` are forgotten afterwards."""
        items: list[tuple[tuple[str, str], _Open]] = list(self._closed)
        items += [(k, o) for k, o in self._open.items()
                  if o.dirty and (o.t1 > o.t0 or o.row_id is not None or o.peak)]
        inserted: list[_Open] = []
        try:
            with conn:
                if conn.isolation_level is None and not conn.in_transaction:
                    conn.execute("BEGIN")  # autocommit connection: one transaction
                for key, o in items:
                    if o.row_id is None:
                        inserted.append(o)
                    self._write(conn, key, o)
        except BaseException:
            # Rolled back: those rows don't exist; write them again next time.
            for o in inserted:
                o.row_id = None
            for _, o in items:
                o.dirty = True
            raise
        self._closed.clear()
        for key in self._ended:
            self._open.pop(key, None)
            self._total.pop(key, None)
        self._ended.clear()
        return len(items)

    @staticmethod
    def _write(conn: sqlite3.Connection, key: tuple[str, str], o: _Open) -> None:
        if o.row_id is None:
            cur = conn.execute(
                "INSERT INTO usage (job_id, gpu_uuid, t0, t1, gpu_seconds, mem_gib_hours,"
                " peak_mem_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key[0], key[1], o.t0, o.t1, o.gpu_seconds, o.mem_gib_hours, o.peak))
            o.row_id = cur.lastrowid
        else:
            conn.execute(
                "UPDATE usage SET t1 = ?, gpu_seconds = ?, mem_gib_hours = ?,"
                " peak_mem_bytes = ? WHERE id = ?",
                (o.t1, o.gpu_seconds, o.mem_gib_hours, o.peak, o.row_id))
        o.dirty = False


def _snapshot(key: tuple[str, str], o: _Open) -> tuple[tuple[str, str], _Open]:
    return key, _Open(t0=o.t0, t1=o.t1, last_mem=o.last_mem, last_share=o.last_share,
                      gpu_seconds=o.gpu_seconds,
                      mem_gib_hours=o.mem_gib_hours, peak=o.peak, row_id=o.row_id)


def prune(conn: sqlite3.Connection, before: float, keep: Iterable[str] = ()) -> int:
    """Delete usage rows that ended before ``before`` (epoch seconds), except
    those of the jobs in ``keep`` (still running); returns how many."""
    kept = [str(j) for j in keep]
    q = "DELETE FROM usage WHERE t1 < ?"
    if kept:
        q += f" AND job_id NOT IN ({', '.join('?' * len(kept))})"
    with conn:
        cur = conn.execute(q, [before, *kept])
    return int(cur.rowcount or 0)


def read_usage(conn: sqlite3.Connection, since: float | None = None,
               until: float | None = None) -> list[UsageRow]:
    """Usage rows that overlap [since, until) (all when both are None).
    Returns [] when the table does not exist yet."""
    q = ("SELECT job_id, gpu_uuid, t0, t1, gpu_seconds, mem_gib_hours, peak_mem_bytes"
         " FROM usage WHERE 1 = 1")
    args: list[float] = []
    if since is not None:
        q += " AND t1 >= ?"
        args.append(since)
    if until is not None:
        q += " AND t0 < ?"
        args.append(until)
    q += " ORDER BY t0, id"
    try:
        rows = conn.execute(q, args).fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []
        raise
    return [UsageRow(str(r[0]), str(r[1]), float(r[2]), float(r[3]), float(r[4]),
                     float(r[5]), int(r[6])) for r in rows]
