"""The daemon applies retention_days by itself, at start and then hourly."""

from __future__ import annotations

import time

from support.daemon import needs_native, wait_for
from support.store import DAY, fill_db, job_names

from vgpuctl.store.database import ENDED


@needs_native
def test_the_daemon_applies_retention_at_start(daemon_factory):
    d = daemon_factory(config="retention_days = 30\n", start=False)
    now = time.time()
    db = d.state / "vgpu.db"
    fill_db(db, [("old", ENDED, now - 31 * DAY), ("recent", ENDED, now - 29 * DAY)])
    d.start()
    wait_for(lambda: job_names(db) == {"recent"}, what="the old job to be pruned")
    assert "retention: removed 1 jobs and 1 usage rows" in d.log.read_text()
