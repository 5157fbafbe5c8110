"""Regenerate a flag catalogue from an installed SGLang: ``python -m servetune.engines.catalog --python PY``.

The probe runs under SGLang's interpreter (``PY``); the hand-kept ``removed:`` and ``limits:`` facts of
an existing catalogue of the same version are carried over (none: the nearest shipped catalogue's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from servetune.engines.catalog import CATALOG_DIR, catalog_from_probe, hand_kept, write_catalog

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
    catalog = catalog_from_probe(dump, *hand_kept("sglang", dump["version"], a.out))
    path = write_catalog(catalog, a.out)
    print(f"{path}: {len(dump['flags'])} flags, {len(catalog.removed)} removed, {len(catalog.limits)} limits")


if __name__ == "__main__":
    main()
