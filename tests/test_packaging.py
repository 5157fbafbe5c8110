"""servetune joins an existing Airflow: ranges in pyproject.toml, exact versions in constraints.txt, and a wheel
that carries the Airflow side (operators and DAG files) with a way to find its DAGs folder."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DAG_FILES = {"servetune_weekly.py", "servetune_on_change.py", "servetune_watch.py"}


def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for items in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in items if not r.startswith("servetune[")]
    return reqs


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    return pins


def test_dependencies_are_ranges_and_constraints_pin_each_inside_it() -> None:
    pins = _constraints()
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name == "sglang":  # a runner image's engine: the one version its catalogue and image were built for
            assert any(s.operator == "==" for s in req.specifier)
            continue
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req}: a pin, not a range"
        assert name in pins, f"{req.name} has no tested version in constraints.txt"
        assert req.specifier.contains(pins[name]), f"constraints.txt {name}=={pins[name]} is outside {req}"


def test_the_installed_environment_is_the_constrained_one() -> None:
    from importlib.metadata import version

    for name, pinned in _constraints().items():
        assert version(name) == pinned, f"{name}: installed {version(name)}, constraints.txt says {pinned}"


def test_the_dags_folder_is_printed_and_holds_the_dags() -> None:
    out = subprocess.run([sys.executable, "-m", "servetune_airflow"], capture_output=True, text=True, check=True)
    folder = Path(out.stdout.strip())
    assert folder.is_dir() and {p.name for p in folder.glob("*.py")} == DAG_FILES
    assert not (folder / "__init__.py").exists()  # DAG files, not a package: the dag-processor parses each
    from servetune.commands.airflow import dags_folder

    assert dags_folder() == folder


@pytest.mark.slow
def test_the_wheel_ships_the_airflow_side_with_ranges(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("servetune-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = Parser().parsestr(zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
    assert {f"servetune_airflow/dags/{f}" for f in DAG_FILES} <= names
    assert {"servetune_airflow/__init__.py", "servetune_airflow/__main__.py", "servetune_airflow/tasks.py"} <= names
    assert not any(n.startswith(("operators/", "dags/", "tests/")) for n in names)
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    pinned = [str(r) for r in reqs if r.name != "sglang" and any(s.operator == "==" for s in r.specifier)]
    assert len(reqs) >= len(_requirements()) - 1 and pinned == [], pinned
