"""Imports run one way: a lower layer never imports a higher one, the library never imports Airflow or the
operators, and the packages form no import circle (every import counts, those inside functions too)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "servetune"

# lower -> higher: a module may import its own layer and the ones before it (the chain)
CHAIN = [
    {"servetune.records", "servetune.sla", "servetune.workload"},
    {"servetune.loadgen", "servetune.telemetry"},
    {"servetune.metrics"},
    {"servetune.trial"},
    {"servetune.tuning"},
    {"servetune.commands"},
]


def _modules() -> dict[str, Path]:
    out = {}
    for p in LIB.rglob("*.py"):
        if "migrations" in p.parts:
            continue
        name = ".".join(p.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, absolute, whether at the top or inside a function (not the ones under
    ``if TYPE_CHECKING:``, which never run)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}  # annotations only: never run
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "servetune" and len(parts) > 1 else parts[0]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path) for name, path in mods.items()}


def _package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    mods = set(graph)
    edges: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        for t in targets:
            if t in mods and _package(t) != _package(a):
                edges[_package(a)].add(_package(t))
    return edges


def test_the_library_never_imports_airflow_or_the_operators(graph) -> None:
    bad = sorted(f"{m} imports {t}" for m, ts in graph.items() for t in ts
                 if t.split(".")[0] in ("airflow", "servetune_airflow"))
    assert bad == []


def test_no_lower_layer_imports_a_higher_one(graph) -> None:
    rank = {pkg: i for i, layer in enumerate(CHAIN) for pkg in layer}
    edges = _package_edges(graph)
    bad = sorted(f"{a} (layer {rank[a]}) imports {b} (layer {rank[b]})" for a, bs in edges.items() for b in bs
                 if a in rank and b in rank and rank[b] > rank[a])
    assert bad == []
    # and only the CLI reaches the commands
    users = sorted(a for a, bs in edges.items() if "servetune.commands" in bs and a != "servetune.cli")
    assert users == []


def test_the_packages_form_no_import_circle(graph) -> None:
    edges = _package_edges(graph)

    def reaches(a: str, b: str) -> bool:
        seen, stack = {a}, [a]
        while stack:
            for y in edges.get(stack.pop(), ()):
                if y == b:
                    return True
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return False

    circles = {frozenset({a, b}) for a, bs in edges.items() for b in bs if reaches(b, a)}
    assert circles == set(), sorted(map(sorted, circles))


def test_the_warehouse_never_imports_validation(graph) -> None:
    assert "servetune.validation" not in _package_edges(graph).get("servetune.warehouse", set())


def test_no_two_modules_import_each_other(graph) -> None:
    """Within a package too: a module circle (even through an import inside a function) is a flow running
    backwards, e.g. a view that loads its own source."""
    mods = set(graph)
    edges = {a: {t for t in ts if t in mods and t != a} for a, ts in graph.items()}
    pairs = sorted(f"{a} <-> {b}" for a, bs in edges.items() for b in bs if a < b and a in edges.get(b, set())
                   and not a.endswith("__init__") and b.rpartition(".")[0] != a and a.rpartition(".")[0] != b)
    assert pairs == []


def test_tuning_plan_and_runners_name_no_engine_flag() -> None:
    """Engine knowledge lives in servetune/engines: the tuner, the plan and the runners ask an engine's
    ``tuning`` knobs (default grid, running-request cap, prefix-cache switch, policy flag, API-key variable)
    and never spell one of them in code (messages and docstrings may)."""
    from servetune.engines.registry import ENGINES

    names: set[str] = set()
    for cls in ENGINES.values():
        k = cls.tuning
        names |= set(k.grid) | set(k.directions) | {x for x in (k.max_running, k.prefix_cache_off,
                                                                  k.schedule_policy, k.api_key_env) if x}
    assert {"max-running-requests", "max-num-seqs", "VLLM_API_KEY"} <= names  # the engines declare them
    found = []
    files = [*(LIB / "tuning").rglob("*.py"), *(LIB / "runners").rglob("*.py"), *(LIB / "plan").rglob("*.py")]
    assert len(files) > 30, files  # the three packages are where they were: an empty glob proves nothing
    for path in files:
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef,
                ast.AsyncFunctionDef, ast.ClassDef)) and n.body and isinstance(n.body[0], ast.Expr)}
        found += [f"{path.relative_to(REPO)}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value in names and id(n) not in docs]
    assert not found, found


def test_parsing_the_weekly_dag_imports_no_heavy_library(tmp_path) -> None:
    """Airflow parses a DAG file in every task process before the task runs: scipy.stats (1.5 s of import) waits
    for the first quantile a task computes, aiohttp (with the load client) for the first load, GX for the first
    check (each imported on first use)."""
    code = ("import runpy, sys; runpy.run_path(sys.argv[1]); "
            "print(sorted(m for m in ('scipy.stats', 'great_expectations', 'aiohttp') if m in sys.modules))")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "SERVETUNE_PLANS_DIR": str(REPO / "plans" / "weekly")}
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "servetune_airflow/dags/servetune_weekly.py")],
                         env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]", out


def test_no_module_is_over_400_lines() -> None:
    """One module, one job: a module that outgrows 400 lines has two (the migrations are generated and exempt)."""
    long = {str(p.relative_to(REPO)): n for p in [*LIB.rglob("*.py"), *(REPO / "servetune_airflow").rglob("*.py")]
            if "migrations" not in p.parts and (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
