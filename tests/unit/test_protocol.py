"""The wire protocol, checked at the edge: typed requests or a clear error."""

from __future__ import annotations

import json

import pytest

from vgpuctl import errors
from vgpuctl.core import protocol as P


def req(**fields):
    return json.dumps({"v": 1, **fields})


def test_a_good_run_request_becomes_a_typed_request():
    r = P.parse_request(req(op="run", command=["python", "x.py"], cwd="/", mem=1 << 30,
                            core=30, policy="soft", gpu="0", name="train"))
    assert r == P.Run(command=["python", "x.py"], cwd="/", mem=1 << 30, core=30,
                      policy="soft", gpu="0", name="train")


def test_optional_fields_may_be_null():
    assert P.parse_request(req(op="run", command=["x"], cwd="/", mem=None)).mem is None


@pytest.mark.parametrize("line,needle", [
    (b"not json", "not JSON"),
    (b"\xff\xfe\x00garbage", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (req(op="run"), "missing field 'command'"),
    (req(op="fly"), "unknown op"),
    (req(op=3), "unknown op"),
    (json.dumps({"op": "ping"}), "version"),
    (json.dumps({"v": 2, "op": "ping"}), "version"),
    (req(op="ping", extra=1), "unknown field"),
    (req(op="run", command="ls", cwd="/"), "list of strings"),
    (req(op="run", command=[], cwd="/"), "non-empty"),
    (req(op="run", command=[1], cwd="/"), "string"),
    (req(op="run", command=["x"], cwd="/", core=0), "1 to 100"),
    (req(op="run", command=["x"], cwd="/", core=True), "integer"),
    (req(op="run", command=["x"], cwd="/", mem=-5), "must be"),
    (req(op="run", command=["x"], cwd="/", mem="4G"), "integer"),
    (req(op="run", command=["x"], cwd="/", policy="fair"), "hard"),
    (req(op="kill", job="../1"), "job id"),
    (req(op="kill", job=1), "job id"),
    (req(op="ps", all="yes"), "true or false"),
    (req(op="slurm_register", slurm_job="12", uid=0, gpus=[0]), "missing field 'shards'"),
    (req(op="slurm_register", slurm_job="12;rm", uid=0, gpus=[0], shards=1), "job id"),
    (req(op="slurm_register", slurm_job="12", uid=-1, gpus=[0], shards=1), "must be"),
    (req(op="slurm_register", slurm_job="12", uid=0, gpus=[], shards=1), "GPU indices"),
    (req(op="slurm_register", slurm_job="12", uid=0, gpus=["0"], shards=1), "GPU indices"),
    (req(op="slurm_register", slurm_job="12", uid=0, gpus=[0], shards=0), "must be"),
    (req(op="slurm_attach", slurm_job="12", pid=0), "must be"),
    (req(op="slurm_release"), "missing field 'slurm_job'"),
])
def test_bad_requests_are_refused_with_a_reason(line, needle):
    with pytest.raises(errors.RequestInvalid, match=needle):
        P.parse_request(line)


def test_replies_round_trip_to_the_right_exception():
    for cls in (errors.UsageError, errors.NotFound, errors.PermissionDenied,
                errors.AdmissionRefused, errors.ProtocolError):
        wire = json.loads(P.encode(P.error(P.error_code(cls("boom")), "boom")))
        exc = P.reply_exception(wire)
        assert type(exc) is cls and str(exc) == "boom"
    assert P.reply_exception(json.loads(P.encode(P.ok(x=1)))) is None
    assert isinstance(P.reply_exception({"hello": 1}), errors.ProtocolError)


def test_encoded_request_is_one_line():
    line = P.encode_request("run", command=["echo", "a\nb"], cwd="/", mem=None)
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert P.parse_request(line) == P.Run(command=["echo", "a\nb"], cwd="/")


def test_json_nested_too_deep_is_a_protocol_error():
    """json recurses once per level: 2,000 levels are a RecursionError, which
    must be a refusal like any bad line, not a traceback in the daemon."""
    for line in ("[" * 2000, '{"v":1,"op":"ping","x":' + "[" * 100_000,
                 '{"a":' * 2000, '{"v":' + "[" * 990 + "]" * 990 + ',"op":"ping"}'):
        with pytest.raises(errors.RequestInvalid):
            P.parse_request(line)


BAD_JOB_IDS = ["0003", "03", "0", "٣", "３", "³", "+3", "-3", " 3", "3 ", "3\n", "1_000",
               "9223372036854775808", "9999999999999999999", "1" * 20, "", "3.0"]


@pytest.mark.parametrize("bad", BAD_JOB_IDS)
def test_a_job_id_on_the_wire_is_its_canonical_ascii_form(bad):
    """"0003" or "٣" (Arabic-Indic three) must not name job 3 (nor any
    other): the daemon takes the one form it writes, and no more than
    SQLite's largest integer."""
    for op, field, extra in (("ps", "job", {}), ("kill", "job", {}), ("set", "job", {}),
                             ("started", "job", {"pid": 1}), ("exited", "job", {}),
                             ("slurm_attach", "slurm_job", {}),
                             ("slurm_release", "slurm_job", {})):
        with pytest.raises(errors.RequestInvalid, match="job id"):
            P.parse_request(req(op=op, **{field: bad}, **extra))


def test_the_largest_job_id_is_sqlites_largest_integer():
    assert P.parse_request(req(op="ps", job="9223372036854775807")).job == str((1 << 63) - 1)
    assert P.parse_request(req(op="kill", job="3")).job == "3"


@pytest.mark.parametrize("spec,sent", [("3", "3"), ("007", "7"), (" 12 ", "12"),
                                       ("9223372036854775807", "9223372036854775807")])
def test_the_cli_sends_a_job_id_in_the_form_the_daemon_takes(spec, sent):
    from vgpuctl.core import nodeview

    assert nodeview.resolve_jobs([], [spec], lambda j: True) == [(spec.strip(), [sent])]
    assert P.is_job_id(sent)


@pytest.mark.parametrize("spec", ["٣", "３", "³", "0", "000", "9223372036854775808",
                                  "1" * 20, "1" * 64])
def test_the_cli_refuses_digits_that_are_no_job_id(spec):
    """`vgpuctl kill ٣` is a usage error, never sent (as job 3 or any)."""
    from vgpuctl.core import nodeview

    assert not nodeview.is_job_id(spec)
    with pytest.raises(errors.UsageError, match="not a job id"):
        nodeview.check_job_args([spec])


CONTROL_CHARS = ["\n", "\r", "\x1b", "\t", "\x00", "\x07", "\x7f", "\x85", "\x9b", "\u2028",
                 "\u2029"]


@pytest.mark.parametrize("c", CONTROL_CHARS)
def test_a_name_with_a_control_character_is_refused(c):
    """A job's name, partition and account are logged and shown as they
    are: a newline in one would forge a log line, an escape would drive the
    operator's terminal."""
    with pytest.raises(errors.RequestInvalid, match="name: contains"):
        P.parse_request(req(op="run", command=["x"], cwd="/", name=f"a{c}b"))
    for field in ("name", "partition", "account"):
        with pytest.raises(errors.RequestInvalid, match=f"{field}: contains"):
            P.parse_request(req(op="slurm_register", slurm_job="12", uid=0, gpus=[0],
                                shards=1, **{field: f"a{c}b"}))


def test_free_text_may_hold_line_breaks():
    """A command line and a directory may hold anything but NUL: they are
    escaped where they are written, not refused."""
    r = P.parse_request(req(op="run", command=["echo", "a\nb\x1b"], cwd="/tmp/a\nb",
                            name="näme-ü 名前"))
    assert r.cwd == "/tmp/a\nb" and r.name == "näme-ü 名前"
    r = P.parse_request(req(op="slurm_register", slurm_job="12", uid=0, gpus=[0], shards=1,
                            command="a\nb", cwd="/x\ny"))
    assert r.command == "a\nb" and r.cwd == "/x\ny"


def test_escaped_text_is_one_line_without_controls():
    text = "a\nb\r\x1b[2K\x85\u2028\u2029\x7f\tz"
    out = P.escape_controls(text)
    assert out == "a\\nb\\r\\x1b[2K\\x85\\u2028\\u2029\\x7f\\tz"
    assert out.isprintable() and len(out.splitlines()) == 1
    assert P.escape_controls("plain ü 名前") == "plain ü 名前"
