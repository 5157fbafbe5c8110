"""bench/ holds scripts, not a package: one way for a test to import one of them as the module it is."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` as module ``name``, loaded once per process. Registered in ``sys.modules`` before it
    runs: dataclasses look their module up while a class is built, and the script's own sibling imports find it."""
    if (loaded := sys.modules.get(name)) is not None and getattr(loaded, "__file__", None) == str(BENCH / f"{name}.py"):
        return loaded
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
