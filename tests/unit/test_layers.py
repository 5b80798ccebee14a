"""The architecture's rules (docs/architecture.md), checked on the source:
which layer of vgpuctl may import which, that the core does no I/O, and
that SQLite, click and rich each live in one layer. Imports inside
functions count as much as those at the top."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__import__("vgpuctl").__file__).resolve().parent

# layer -> the layers of vgpuctl it may import ("vgpuctl" is the package's
# own __init__, for __version__).
ALLOWED = {
    "errors": set(),
    "core": {"errors"},
    "store": {"core", "errors"},
    "system": {"core", "errors"},
    "client": {"core", "system", "errors"},
    "daemon": {"core", "store", "system", "errors", "vgpuctl"},
    "ops": {"core", "client", "daemon", "store", "system", "errors"},
    "cli": {"core", "client", "daemon", "ops", "store", "system", "errors", "vgpuctl"},
    "__main__": {"cli"},
    "__init__": set(),
}

# Nothing in the core touches the machine: no files, clock, environment,
# processes, network, logging or terminal.
CORE_FORBIDDEN = {
    "os", "sys", "time", "logging", "sqlite3", "socket", "subprocess", "pathlib", "shutil",
    "tempfile", "signal", "threading", "multiprocessing", "asyncio", "select", "selectors",
    "mmap", "ctypes", "fcntl", "pwd", "grp", "random", "secrets", "uuid", "platform",
    "glob", "urllib", "http", "cffi", "pynvml", "psutil", "rich", "click", "prometheus_client",
}
# Calls that read the clock or do I/O without an import.
CORE_FORBIDDEN_CALLS = {"open", "print", "input", "now", "today", "utcnow"}

# A package that lives in exactly one layer.
OWNED = {"sqlite3": {"store"}, "rich": {"cli"}, "click": {"cli"}}


def layer_of(path: Path, package: Path) -> str:
    rel = path.relative_to(package).parts
    return rel[0].removesuffix(".py")


def imports(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "vgpuctl":
                out += [(node.lineno, f"vgpuctl.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


def violations(package: Path) -> list[str]:
    """Every broken rule in the package at ``package``, one line each."""
    found: list[str] = []
    for path in sorted(package.rglob("*.py")):
        if "_native" in path.parts:
            continue
        layer = layer_of(path, package)
        where = f"{path.relative_to(package.parent)}"
        tree = ast.parse(path.read_text(), str(path))
        for line, mod in imports(tree):
            top = mod.split(".")[0]
            if mod.startswith("."):
                found.append(f"{where}:{line}: relative import {mod!r} (use vgpuctl.LAYER...)")
                continue
            if top == "vgpuctl":
                parts = mod.split(".")
                target = parts[1] if len(parts) > 1 else "vgpuctl"
                if target == "__version__":
                    target = "vgpuctl"
                if target != layer and target not in ALLOWED.get(layer, set()):
                    found.append(f"{where}:{line}: the {layer} layer imports {mod}")
                continue
            if top in OWNED and layer not in OWNED[top]:
                found.append(f"{where}:{line}: {top} is imported outside "
                             f"{', '.join(sorted(OWNED[top]))}")
            if layer == "core" and top in CORE_FORBIDDEN:
                found.append(f"{where}:{line}: the core imports {mod} (no I/O in core)")
        if layer == "core":
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else \
                        f.attr if isinstance(f, ast.Attribute) else None
                    if name in CORE_FORBIDDEN_CALLS:
                        found.append(f"{where}:{node.lineno}: the core calls {name}()")
    return found


def test_the_package_keeps_its_layers():
    assert violations(PACKAGE) == []


def test_the_rules_catch_io_in_the_core(tmp_path):
    """The checker itself: an I/O import, a clock read or a layer breach
    added to a copy of a module is reported."""
    pkg = tmp_path / "vgpuctl"
    (pkg / "core").mkdir(parents=True)
    (pkg / "store").mkdir()
    (pkg / "core" / "sizes.py").write_text("import os\n")
    (pkg / "core" / "clock.py").write_text(
        "from datetime import datetime\n\ndef f():\n    return datetime.now()\n")
    (pkg / "core" / "up.py").write_text("def f():\n    from vgpuctl.store import jobs\n")
    (pkg / "store" / "ui.py").write_text("from rich.table import Table\n")
    found = "\n".join(violations(pkg))
    assert "vgpuctl/core/sizes.py:1: the core imports os" in found
    assert "vgpuctl/core/clock.py:4: the core calls now()" in found
    assert "vgpuctl/core/up.py:2: the core layer imports vgpuctl.store" in found
    assert "vgpuctl/store/ui.py:1: rich is imported outside cli" in found


def test_the_architecture_docs_draw_this_table():
    """docs/architecture.md's layer block is this file's ALLOWED, line by line."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    block = doc[doc.index("layer      may import"):].split("```")[0]
    drawn = {}
    for line in block.splitlines()[1:]:
        if line.strip():
            name, rest = line.split(None, 1)
            drawn[name] = set() if rest.strip() == "-" else {
                x.strip() for x in rest.split(",")}
    want = {k: v - {"vgpuctl"} for k, v in ALLOWED.items() if k not in ("__main__", "__init__")}
    assert drawn == want


DAEMON_BLOCK = "### The daemon, split by concern"


def daemon_imports(package: Path) -> dict[str, set[str]]:
    """Each module of the daemon and the daemon's modules it imports, inside
    functions too, but not under ``if TYPE_CHECKING:`` (annotations only)."""
    out: dict[str, set[str]] = {}
    for path in sorted((package / "daemon").glob("*.py")):
        if path.stem == "__init__":
            continue
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test)
                       for stmt in node.body for n in ast.walk(stmt)}
        uses: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "vgpuctl.daemon":
                uses |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("vgpuctl.daemon."):
                uses.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                uses |= {a.name.split(".")[2] for a in node.names
                         if a.name.startswith("vgpuctl.daemon.")}
        out[path.stem] = uses - {path.stem}
    return out


def drawn_daemon(doc: str) -> list[tuple[str, set[str]]]:
    """The daemon's import block of docs/architecture.md, in its order."""
    section = doc[doc.index(DAEMON_BLOCK):]
    block = section.split("```")[1]
    rows = []
    for line in block.splitlines():
        if line.strip():
            name, rest = line.split(None, 1)
            rows.append((name, set() if rest.strip() == "-" else set(rest.split())))
    return rows


def test_the_architecture_docs_draw_the_daemons_imports():
    """docs/architecture.md's map of the daemon is its imports: every
    module in it, each with the daemon modules it imports, none importing a
    module drawn above it, and each named in the modules' table."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    real = daemon_imports(PACKAGE)
    rows = drawn_daemon(doc)
    right = "\n".join(f"{m:<11} {' '.join(sorted(u)) or '-'}" for m, u in sorted(real.items()))
    assert dict(rows) == real, f"the daemon's imports are now:\n{right}"
    order = [m for m, _ in rows]
    upward = [f"{m} imports {u}" for i, (m, uses) in enumerate(rows)
              for u in sorted(uses) if u in order[:i]]
    assert upward == []
    table = doc[doc.index("| module | does | used by the lifecycle through |"):]
    table = table[:table.index("\n\n")]
    named = {name for line in table.splitlines()[2:]
             for name in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert set(real) - named == set(), "daemon modules missing from the modules' table"


def test_the_daemon_map_check_sees_a_new_import(tmp_path):
    """The check itself: an import added to a copy of a daemon module, one
    under TYPE_CHECKING (not counted), and a module drawn above its import."""
    pkg = tmp_path / "vgpuctl"
    (pkg / "daemon").mkdir(parents=True)
    (pkg / "daemon" / "jobs.py").write_text("def f():\n    from vgpuctl.daemon import views\n")
    (pkg / "daemon" / "views.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from vgpuctl.daemon.jobs import JobTable\n")
    assert daemon_imports(pkg) == {"jobs": {"views"}, "views": set()}
    rows = drawn_daemon(f"{DAEMON_BLOCK}\n\n```\nviews  -\njobs   views\n```\n")
    assert rows == [("views", set()), ("jobs", {"views"})]
