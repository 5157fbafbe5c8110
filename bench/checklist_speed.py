"""What checking one trial against the report checklist costs: the way a campaign did it before (a new Great
Expectations context, suites and validation definitions per trial, result_format SUMMARY) against the way it
does now (servetune.validation.checklist: built once a process, result_format BASIC), on the same trials in
one run, alternating, so the ratio holds whatever the machine's load. Both give the same outcomes (checked).

    .venv/bin/python bench/checklist_speed.py [--rounds 5] [TRIAL.json ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servetune.result import TrialResult  # noqa: E402
from servetune.validation import checklist as c  # noqa: E402
from servetune.validation.frames import build_frames  # noqa: E402

DEFAULT = [REPO / "tests/data/gpu-h200/bench-c32.json", *sorted((REPO / "tests/data").glob("**/trials/*.json"))[:5]]


def before(frames: Any, params: dict[str, Any], waive: frozenset[str]) -> list[Any]:
    """A fresh context, suites and definitions for the trial, SUMMARY results (the code as it was)."""
    from great_expectations.core.expectation_suite import ExpectationSuite

    gx, ctx = c.gx_context()
    source = ctx.data_sources.add_pandas(name="trial")
    frame_of = {"trial_summary": frames.summary, "trial_requests": frames.requests, "trial_gpu": frames.gpu}
    out = []
    for name in c.suites_for(waive):
        batch = source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe("whole")
        suite = ctx.suites.add(ExpectationSuite(**c.load_suite(name, waive)))
        definition = ctx.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=suite))
        vr = definition.run(batch_parameters={"dataframe": frame_of[name]}, expectation_parameters=params,
                            result_format="SUMMARY")
        out.extend(c._outcome(name, r) for r in vr.to_json_dict()["results"])  # noqa: SLF001
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trials", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    inputs = []
    for path in args.trials:
        r = TrialResult.read(path)
        params, waive = c.checklist_inputs(r)
        inputs.append((path.name, build_frames(r), params, waive))
    c.run_suites(inputs[0][1], inputs[0][2], waive=inputs[0][3])  # imports and first-use costs, for both
    old: list[float] = []
    new: list[float] = []
    for _ in range(args.rounds):
        for name, frames, params, waive in inputs:
            t = time.perf_counter()
            a = before(frames, params, waive)
            old.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = c.run_suites(frames, params, waive=waive).results
            new.append(time.perf_counter() - t)
            if [o.model_dump() for o in a] != [o.model_dump() for o in b]:
                print(f"{name}: the outcomes differ", file=sys.stderr)
                return 1
    mo, mn = statistics.median(old), statistics.median(new)
    print(f"{len(inputs)} trials x {args.rounds} rounds, same outcomes: before {mo * 1000:.0f} ms, now"
          f" {mn * 1000:.0f} ms a trial (median): x{mn / mo:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
