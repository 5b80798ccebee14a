"""The architecture's rules (docs/architecture.md), checked on the source:
which layer of vgpuctl may import which, that the core does no I/O, and
that SQLite, click and rich each live in one layer. Imports inside
functions count as much as those at the top."""

from __future__ import annotations

import ast
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
