"""The library's boundaries (docs/design.md, "Where things live"): rota's modules import
each other without a cycle, and ``import rota`` (and so every worker) loads no web
framework."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import rota

SRC = Path(rota.__file__).parent.parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """rota's modules and the rota modules each imports, ``if TYPE_CHECKING:`` imports
    and imports inside functions included (``from . import x`` names module ``x``)."""
    paths = {module_name(p): p for p in (SRC / "rota").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in paths else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in paths and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_imports_it_must() -> None:
    graph = import_graph()
    assert {"rota.runner.context", "rota.runner.completer", "rota.runner.stage",
            "rota.runner.batch"} <= graph["rota.runner.loop"] | graph["rota.runner.batch"]
    assert "rota.admin" in graph["rota.queue"]  # `from . import admin as _admin`
    assert "rota.web.dashboard" in graph["rota.web"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_rota_imports_itself_back() -> None:
    assert cycles(import_graph()) == []


def test_only_the_queue_drives_the_fair_claim() -> None:
    """docs/design.md, "Where things live": ``fair/`` is entered by ``queue.py``; the
    ``rota verify`` command imports its report types to print them."""
    graph = import_graph()
    entering = {m for m, deps in graph.items() if not m.startswith("rota.fair")
                and any(d == "rota.fair" or d.startswith("rota.fair.") for d in deps)}
    assert entering == {"rota.queue", "rota.cli.verify"}


@pytest.mark.parametrize("module", [
    "rota.transitions", "rota.give_up", "rota.enqueue", "rota.runner.settle",
    "rota.runner.pipeline", "rota.runner.loop", "rota.runner.batch",
    "rota.runner.recording", "rota.runner.context", "rota.runner.stage",
    "rota.runner.completer", "rota.runner.source", "rota.admin", "rota.queue",
    "rota.worker"])
def test_each_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", f"import {module}"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")


LOADED_WEB = ("import sys, {modules}; print(sorted(m for m in sys.modules"
              " if m.split('.')[0] in ('starlette', 'uvicorn', 'jinja2')))")


@pytest.mark.parametrize("modules", ["rota, rota.worker", "rota.cli"])
def test_the_library_and_the_worker_load_no_web_framework(modules: str) -> None:
    done = subprocess.run([sys.executable, "-c", LOADED_WEB.format(modules=modules)],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")


def test_the_web_apps_are_still_reachable_from_rota() -> None:
    done = subprocess.run([sys.executable, "-c", (
        "import rota, rota.web, sys; "
        "print(rota.cron_app is rota.web.cron_app, rota.dashboard_app.__module__, "
        "rota.web.resolve_pipeline is rota.worker.resolve_pipeline, "
        "'starlette' in sys.modules)")], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "True rota.web.dashboard True True\n")
