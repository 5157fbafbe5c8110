"""Regenerate a flag catalogue from an installed SGLang: ``python -m servetune.engines.catalog --python PY``.

The probe runs under SGLang's interpreter (``PY``); the hand-kept ``removed:`` facts of an existing
catalogue of the same version are carried over.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import yaml

from servetune.engines.catalog import CATALOG_DIR, catalog_from_probe, write_catalog

PROBE = Path(__file__).with_name("sglang_probe.py")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m servetune.engines.catalog", description=__doc__)
    ap.add_argument("--python", required=True, help="an interpreter where sglang is importable")
    ap.add_argument("--pythonpath", default=None, help="PYTHONPATH for that interpreter (a --target install)")
    ap.add_argument("--out", type=Path, default=CATALOG_DIR)
    a = ap.parse_args()
    env = dict(os.environ)
    if a.pythonpath:
        env["PYTHONPATH"] = a.pythonpath
    out = subprocess.run([a.python, str(PROBE), "dump"], env=env, check=True, capture_output=True, text=True)
    dump = json.loads(out.stdout)
    existing = a.out / f"sglang-{dump['version']}.yaml"
    removed = (yaml.safe_load(existing.read_text()) or {}).get("removed") if existing.is_file() else None
    path = write_catalog(catalog_from_probe(dump, removed), a.out)
    print(f"{path}: {len(dump['flags'])} flags")


if __name__ == "__main__":
    main()
