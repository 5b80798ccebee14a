"""Help an installed vgpuctl can give: `vgpuctl help TOPIC` prints texts
shipped in the package (a pip install has no docs/ or etc/), help texts
name no repository paths, and the man page, generated from the click
commands, is shipped current."""

from __future__ import annotations

import re
import subprocess

import click
import pytest
from support import REPO
from support.daemon import vgpuctl_argv

from vgpuctl.cli import cli, manpage
from vgpuctl.system import topics

PAGE = REPO / "vgpuctl" / "cli" / manpage.SHIPPED


def commands():
    return list(manpage.walk(cli, manpage.context(cli, "vgpuctl")))


def test_the_shipped_man_page_is_generated_from_the_commands():
    assert PAGE.read_text() == manpage.generate(), (
        "the commands changed: regenerate the man page with "
        "`python -m vgpuctl.cli.manpage > vgpuctl/cli/vgpuctl.1`")


def test_the_man_page_covers_every_command_and_option():
    page = manpage.generate()
    for path, cmd, ctx in commands()[1:]:
        name = " ".join(path)
        assert f".SS vgpuctl {name}\n" in page, name
        for p in cmd.get_params(ctx):
            if p is cmd.get_help_option(ctx) or not isinstance(p, click.Option):
                continue
            for opt in p.opts:
                assert manpage._esc(opt) in page, (name, opt)
    for code in (2, 3, 78):
        assert f".TP\n\\fB{code}\\fR\n" in page


@pytest.mark.parametrize("topic", list(topics.TOPICS))
def test_every_topic_is_shipped_and_printed(topic, tmp_path, monkeypatch):
    src = REPO / topics.TOPICS[topic][0]
    topics.copy_into(tmp_path)
    monkeypatch.setattr(topics, "SHIPPED", tmp_path)
    monkeypatch.setattr(topics, "SOURCE_TREE", tmp_path / "no-checkout")
    assert topics.text(topic) == src.read_text()     # read from the package's copy


def test_help_config_prints_the_config_reference():
    r = subprocess.run([*vgpuctl_argv(), "help", "config"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout == (REPO / "docs" / "config.md").read_text()
    listing = subprocess.run([*vgpuctl_argv(), "help"], capture_output=True, text=True,
                             timeout=60)
    assert listing.returncode == 0
    for t in topics.TOPICS:
        assert f"\n  {t} " in listing.stdout


REPO_PATH = re.compile(r"(?<![\w/.~])(docs|etc|libvgpu|bench|tests)/")


def test_help_texts_name_no_repository_paths():
    """An installed vgpuctl has no docs/ or etc/: help points at `vgpuctl
    help TOPIC` instead."""
    for path, cmd, ctx in commands():
        texts = [cmd.help or ""]
        texts += [p.help or "" for p in cmd.get_params(ctx) if isinstance(p, click.Option)]
        for t in texts:
            assert not REPO_PATH.search(t), (path, t)


def test_the_cli_docs_have_a_section_for_every_command_and_name_its_options():
    """docs/cli.md (`vgpuctl help cli`) documents each command in a section
    of its own, with every option."""
    doc = (REPO / "docs" / "cli.md").read_text()
    headed = {w for line in doc.splitlines() if line.startswith("## ")
              for w in re.findall(r"[\w-]+", line)}
    names = cli.list_commands(click.Context(cli))
    assert [n for n in names if n not in headed] == []
    missing = []
    for path, cmd, ctx in commands()[1:]:
        for p in cmd.get_params(ctx):
            if p is cmd.get_help_option(ctx) or not isinstance(p, click.Option):
                continue
            if not any(re.search(rf"{re.escape(o)}\b", doc) for o in p.opts):
                missing.append(f"vgpuctl {' '.join(path)} {p.opts[0]}")
    assert missing == []
