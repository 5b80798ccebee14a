"""The config file: every key read, every mistake named with file and key."""

from __future__ import annotations

import pytest
from support import REPO

from vgpuctl.core.config import Config, SlurmConfig, UserLimits, parse_config
from vgpuctl.errors import ConfigError
from vgpuctl.system.config_file import load_config

G = 1 << 30


def write(tmp_path, text):
    p = tmp_path / "vgpu.toml"
    p.write_text(text)
    return p


def test_defaults():
    c = Config()
    assert c.tick_ms == 100 and c.reserve == 512 << 20 and c.oversubscribe == 1.0
    assert c.default_policy == "hard" and c.default_mem is None and c.metrics_address == ""


def test_every_key(tmp_path):
    p = write(tmp_path, """
socket = "/run/x/vgpud.sock"
runtime_dir = "/run/x"
state_dir = "/var/lib/x"
tick_ms = 50
reserve = "1G"
oversubscribe = 1.5
default_policy = "soft"
default_mem = "2G"
metrics_address = "127.0.0.1:9400"
log_level = "debug"
retention_days = 30
[limits.default]
max_mem = "8G"
max_core = 50
[limits.users.alice]
max_mem = "12G"
[slurm]
gpus = [1, 0]
allow_run = true
shard_size = "2G"
reconcile_s = 0
""")
    c = load_config(p)
    assert c.socket == "/run/x/vgpud.sock" and c.runtime_dir == "/run/x"
    assert c.tick_ms == 50 and c.reserve == G and c.oversubscribe == 1.5
    assert c.default_policy == "soft" and c.default_mem == 2 * G
    assert c.metrics_address == "127.0.0.1:9400" and c.log_level == "debug"
    assert c.retention_days == 30
    assert c.limits_for("alice", 1000) == UserLimits(max_mem=12 * G)
    assert c.limits_for("bob", 1001) == UserLimits(max_mem=8 * G, max_core=50)
    assert c.limits_for("root", 0) == UserLimits.none()
    assert c.limits_for("carol", 1002, admin=True) == UserLimits.none()
    assert c.slurm == SlurmConfig(gpus=(0, 1), allow_run=True, shard_size=2 * G, reconcile_s=0)


def test_per_user_caps_have_defaults_a_table_may_change_or_lift():
    d = Config().limits_for("bob", 1001)
    assert (d.max_jobs, d.max_starting, d.admission_rate, d.max_total_share) == \
        (64, 8, 10.0, 0.9)
    c = parse_config({"limits": {"default": {"max_jobs": 3, "max_starting": "none",
                                             "admission_rate": 0.5,
                                             "max_total_mem": "50%"},
                                 "users": {"alice": {"max_total_mem": "none"}}}})
    b = c.limits_for("bob", 1001)
    assert (b.max_jobs, b.max_starting, b.admission_rate) == (3, None, 0.5)
    assert (b.max_total_mem, b.max_total_share) == (None, 0.5)
    a = c.limits_for("alice", 1000)
    assert (a.max_total_mem, a.max_total_share, a.max_jobs) == (None, None, 64)


def test_slurm_defaults_leave_every_gpu_to_plain_runs():
    s = Config().slurm
    assert (s.gpus, s.allow_run, s.shard_size, s.reconcile_s) == ((), False, G, 60)
    assert not s.controls(0)
    assert parse_config({"slurm": {"gpus": "all"}}).slurm.controls(7)


def test_the_shipped_example_parses():
    example = REPO / "etc" / "vgpu.toml"
    c = load_config(example)
    assert c.tick_ms == 100
    assert c.priority == Config().priority and c.core_oversubscribe == 1.0


def test_priority_table():
    c = parse_config({"priority": {"default": "low", "high_users": ["alice"],
                                   "high_groups": ["inference"], "budget_us": 500,
                                   "holdoff_ms": 50}, "core_oversubscribe": 1.5})
    p = c.priority
    assert (p.default, p.high_users, p.high_groups, p.budget_us, p.holdoff_ms) == (
        "low", ("alice",), ("inference",), 500, 50)
    assert c.core_oversubscribe == 1.5
    d = Config().priority
    assert (d.default, d.high_users, d.budget_us, d.holdoff_ms) == ("normal", (), 1000, 100)


@pytest.mark.parametrize("text,key,reason", [
    ("tick = 5", "tick", "unknown key"),
    ("tick_ms = 5", "tick_ms", "10 to 10000"),
    ("tick_ms = \"fast\"", "tick_ms", "integer"),
    ("reserve = \"lots\"", "reserve", "not a size"),
    ("default_mem = 4", "default_mem", "bare number"),
    ("default_mem = \"4\"", "default_mem", "has no unit: write 4G or 4M"),
    ("[limits.default]\nmax_mem = 8", "limits.default.max_mem", "bare number"),
    ("oversubscribe = 0.5", "oversubscribe", "1.0"),
    ("default_policy = \"fair\"", "default_policy", "hard, soft"),
    ("metrics_address = \"9400\"", "metrics_address", "HOST:PORT"),
    ("socket = \"relative.sock\"", "socket", "absolute path"),
    ("[limits.users.bob]\nmax_gpu = 1", "limits.users.bob.max_gpu", "unknown key"),
    ("[limits.default]\nmax_core = 101", "limits.default.max_core", "1 to 100"),
    ("[limits.default]\nmax_total_mem = \"150%\"", "limits.default.max_total_mem", "1% to 100%"),
    ("[limits.default]\nmax_jobs = 0", "limits.default.max_jobs", "1 to 1000000"),
    ("[limits.default]\nadmission_rate = \"fast\"", "limits.default.admission_rate",
     "admissions a second"),
    ("on_violation = \"stop\"", "on_violation", "report, protect, kill"),
    ("cooldown_s = -1", "cooldown_s", "0 to"),
    ("public_commands = 1", "public_commands", "true or false"),
    ("core_oversubscribe = 0.5", "core_oversubscribe", "1.0"),
    ("[priority]\ndefault = \"urgent\"", "priority.default", "low, normal, high"),
    ("[priority]\nhigh_users = \"alice\"", "priority.high_users", "list of names"),
    ("[priority]\nbudget_us = 0", "priority.budget_us", "50 to 100000"),
    ("[priority]\nhold = 5", "priority.hold", "unknown key"),
    ("[slurm]\ngpus = \"some\"", "slurm.gpus", "list of GPU indices"),
    ("[slurm]\ngpus = [true]", "slurm.gpus", "list of GPU indices"),
    ("[slurm]\nallow_run = 1", "slurm.allow_run", "true or false"),
    ("[slurm]\nshard_size = 1", "slurm.shard_size", "unit"),
    ("[slurm]\nshards = 4", "slurm.shards", "unknown key"),
    ("slurm = 1", "slurm", "table"),
])
def test_bad_values_name_file_key_and_reason(tmp_path, text, key, reason):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert msg.startswith(str(p) + ": " + key + ":"), msg
    assert reason in msg
    assert e.value.exit_code == 78


def test_not_toml(tmp_path):
    p = write(tmp_path, "tick_ms = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml")


def test_parse_config_without_a_file():
    assert parse_config({"reserve": 0}).reserve == 0


@pytest.mark.parametrize("zero", [0, "0", "0B"])
def test_a_zero_reserve_needs_no_unit(zero):
    assert parse_config({"reserve": zero}).reserve == 0


def test_the_mig_layout_is_read_and_a_bad_one_named():
    cfg = parse_config({"mig": {"layout": {"1": ["3g.40gb@4"], "0": ["1g.10gb", "7g.80gb"]}}})
    assert cfg.mig.layout == ((0, ("1g.10gb", "7g.80gb")), (1, ("3g.40gb@4",)))
    for bad, words in (({"layout": {"x": []}}, "GPU index"),
                       ({"layout": {"0": ["3g.40gb@"]}}, "GPU instances"),
                       ({"layout": {"0": "1g.10gb"}}, "GPU instances"),
                       ({"layout": []}, "table"),
                       ({"shape": {}}, "unknown key")):
        with pytest.raises(ConfigError, match=words):
            parse_config({"mig": bad})
