"""The jobs table across versions: a database written before the Slurm
columns, or the priority ones, existed opens, gains them, and keeps its
jobs."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest

from vgpuctl.core.job import JobGpu
from vgpuctl.store.database import SCHEMA_VERSION, JobRecord, Store

# The jobs table as schema 1 created it.
SCHEMA_1 = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, uid INTEGER NOT NULL,
    user TEXT NOT NULL, command TEXT NOT NULL, cwd TEXT NOT NULL, gpus TEXT NOT NULL,
    mem_limit INTEGER NOT NULL, core_share INTEGER NOT NULL, policy TEXT NOT NULL,
    state TEXT NOT NULL, created REAL NOT NULL, started REAL, ended REAL,
    launcher_pid INTEGER, launcher_start INTEGER, root_pid INTEGER, root_start INTEGER,
    pids TEXT NOT NULL DEFAULT '{}', exit_code INTEGER, exit_signal INTEGER, region TEXT);
INSERT INTO jobs (name, uid, user, command, cwd, gpus, mem_limit, core_share, policy,
                  state, created) VALUES ('old', 0, 'root', '["x"]', '/', '[]', 1, 100,
                  'hard', 'running', 1.0);
PRAGMA user_version = 1;
"""


def schema_1_store(tmp_path) -> tuple[Store, JobRecord | None]:
    """A database as schema 1 wrote it, opened now; its one job."""
    db = tmp_path / "vgpu.db"
    conn = sqlite3.connect(db)
    conn.executescript(SCHEMA_1)
    conn.close()
    store = Store.open(db)
    return store, store.get_job("1")


def test_a_schema_1_database_gains_the_slurm_columns(tmp_path):
    store, old = schema_1_store(tmp_path)
    assert old is not None and old.name == "old" and old.slurm_job is None
    rec = JobRecord(name="s", uid=0, user="root", command=["x"], cwd="/", gpus=[],
                    mem_limit=1, core_share=25, policy="hard", created=2.0, slurm_job="42",
                    slurm_partition="gpu", slurm_account="physics", slurm_shards=4)
    store.insert_job(rec)
    got = store.get_job(rec.id)
    assert got is not None
    assert (got.slurm_job, got.slurm_partition, got.slurm_account, got.slurm_shards) == (
        "42", "gpu", "physics", 4)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    store.close()


def test_a_schema_2_database_gains_the_priority_columns(tmp_path):
    """Jobs from before priority classes are normal, with no promised share
    (nothing counted them), and keep everything else."""
    db = tmp_path / "vgpu.db"
    conn = sqlite3.connect(db)
    conn.executescript(SCHEMA_1.replace("PRAGMA user_version = 1;", """
        ALTER TABLE jobs ADD COLUMN slurm_job TEXT;
        ALTER TABLE jobs ADD COLUMN slurm_partition TEXT;
        ALTER TABLE jobs ADD COLUMN slurm_account TEXT;
        ALTER TABLE jobs ADD COLUMN slurm_shards INTEGER;
        ALTER TABLE jobs ADD COLUMN region_error TEXT;
        PRAGMA user_version = 2;"""))
    conn.close()
    store = Store.open(db)
    old = store.get_job("1")
    assert old is not None and old.name == "old" and old.core_share == 100
    assert (old.priority, old.core_promised) == ("normal", False)
    rec = JobRecord(name="h", uid=0, user="root", command=["x"], cwd="/", gpus=[],
                    mem_limit=1, core_share=30, policy="hard", created=2.0, priority="high",
                    core_promised=True)
    store.insert_job(rec)
    got = store.get_job(rec.id)
    assert got is not None and (got.priority, got.core_promised) == ("high", True)
    rec.priority = "low"
    store.update_job(rec, ["priority"])
    assert store.get_job(rec.id).priority == "low"
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == 4
    store.close()


def test_a_schema_2_database_gains_the_suspend_columns(tmp_path):
    """Jobs from before suspend were never suspended; a suspension's fields
    are written and read back."""
    store, old = schema_1_store(tmp_path)
    assert old is not None and (old.suspended_s, old.suspended_at, old.suspensions) == (
        0.0, None, 0)
    old.state, old.suspended_at, old.suspend_reason, old.suspensions = (
        "suspended", 5.0, "asked", 1)
    store.update_job(old, ["state", "suspended_at", "suspend_reason", "suspensions"])
    got = store.get_job("1")
    assert got is not None and got.suspended and got.suspended_for(7.5) == 2.5
    assert got.suspend_reason == "asked"
    store.close()


def test_a_jobs_gpus_are_frozen_records_stored_as_before(tmp_path):
    """A job's GPUs are frozen JobGpu records, stored as the same JSON as
    before they were (index and uuid; a limit only where a GPU has its
    own), read back equal; an entry that is no GPU (a hand-edited row) is
    left out, and `set` clears a GPU's own limit by replacing it."""
    store = Store.open(tmp_path / "vgpu.db")
    rec = JobRecord(name="s", uid=0, user="root", command=["x"], cwd="/",
                    gpus=[{"index": 0, "uuid": "GPU-a"},
                          JobGpu(1, "GPU-b", mem_limit=2, core_share=40), "junk"],
                    mem_limit=4, core_share=25, policy="hard", created=2.0)
    assert rec.gpus == [JobGpu(0, "GPU-a"), JobGpu(1, "GPU-b", 2, 40)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.gpus[0].index = 3
    store.insert_job(rec)
    row = sqlite3.connect(tmp_path / "vgpu.db").execute(
        "SELECT gpus FROM jobs WHERE id = ?", (rec.id,)).fetchone()[0]
    assert json.loads(row) == [{"index": 0, "uuid": "GPU-a"},
                               {"index": 1, "uuid": "GPU-b", "mem_limit": 2, "core_share": 40}]
    assert store.get_job(rec.id) == rec
    assert rec.limits_by_uuid() == {"GPU-a": (4, 25), "GPU-b": (2, 40)}
    rec.set_limits(mem=8)
    assert rec.limits_by_uuid() == {"GPU-a": (8, 25), "GPU-b": (8, 40)}
