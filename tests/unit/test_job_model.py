"""The one job model (vgpuctl.core.job): every output field is declared once,
and what users read of it agrees with it -- docs/cli.md's field tables,
``--fields``, the wire record, the man page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vgpuctl.core import nodeview
from vgpuctl.core.job import (
    GPU_FIELDS,
    JOB_FIELDS,
    GpuView,
    JobRecord,
    Live,
    job_view,
)
from vgpuctl.errors import UsageError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
# docs/cli.md's "type" column, by the model's kind of field.
DOC_TYPES = {"text": "string", "int": "int", "bytes": "int", "share": "float",
             "seconds": "float", "time": "float", "list": "[int]", "argv": "[string]",
             "bool": "bool", "violations": "[object]", "names": "[string]",
             "per_gpu": "[object]"}


def doc_table(heading: str) -> dict[str, str]:
    """{field: its type as documented} of the table after ``heading`` in
    docs/cli.md's "ps --json" section (a row may name several fields, with
    their types in the same order)."""
    text = DOCS.read_text()
    section = text[text.index("### ps --json"):]
    section = section[section.index(heading):]
    out: dict[str, str] = {}
    for line in section.splitlines()[1:]:
        if not line.startswith("|"):
            if out:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = re.findall(r"`(\w+)`", cells[0])
        if not names:
            continue
        types = [t.strip() for t in cells[1].split(",")]
        for i, n in enumerate(names):
            out[n] = types[min(i, len(types) - 1)]
    return out


@pytest.mark.parametrize(("heading", "fields"), [("Each of `gpus`", GPU_FIELDS),
                                                 ("Each of `jobs`", JOB_FIELDS)])
def test_the_docs_field_tables_are_the_models(heading, fields):
    documented = doc_table(heading)
    assert set(documented) == set(fields), (
        f"docs/cli.md ({heading}) and vgpuctl/core/job.py disagree: only in the docs "
        f"{sorted(set(documented) - set(fields))}, only in the model "
        f"{sorted(set(fields) - set(documented))}")
    for name, f in fields.items():
        assert documented[name].startswith(DOC_TYPES[f.kind]), (name, documented[name], f.kind)


def test_the_wire_record_has_every_field_and_nothing_else():
    rec = JobRecord(name="t", uid=1, user="u", command=["x"], cwd="/",
                    gpus=[{"index": 0, "uuid": "GPU-0"}], mem_limit=1, core_share=30,
                    policy="hard", created=0.0, id="1")
    assert list(job_view(rec, Live(), 1.0).wire()) == list(JOB_FIELDS)
    assert list(GpuView(index=0, uuid="GPU-0", name="g", memory_total=1).wire()) == \
        list(GPU_FIELDS)


def test_every_documented_gpu_field_is_a_fields_name():
    """`status --fields minor` was refused though `minor` is documented."""
    names = nodeview.parse_fields("index,minor,slurm", GPU_FIELDS, nodeview.GPU_DEFAULT)
    assert names == ["index", "minor", "slurm"]
    with pytest.raises(UsageError, match="unknown field 'nope'"):
        nodeview.parse_fields("nope", GPU_FIELDS, nodeview.GPU_DEFAULT)
