"""A runnable catalogue of faults: things that go wrong while servetune runs, each provoked for real.

Why: issue 31 asks for "a fresh catalogue of at least 40 bad inputs and 10 faults of your own design, run from
a script kept in bench/, reports every input CLEAR ... and every fault handled". Bad inputs are
bench/bad_inputs.py's; this is the faults' half. A fault is not a wrong input but the world failing under a
command that was right: the engine killed or frozen mid-trial or mid-campaign, a server answering 500s or
cutting streams, the campaign itself signalled or run twice, PostgreSQL stopped, frozen or locked, a port
taken, a disk that fills. Each runs against real parts (``python -m servetune`` as a user runs it, the
simulated SGLang server, tests/sse_server.py's aiohttp fault server, tests/fake_engines' SGLang with an
escaping worker, a private PostgreSQL cluster), loopback only, no GPU, in its own temp dir.

Handled means: the user gets one clear line (no Python traceback, no secret: every command is given an API key
that must show nowhere, in its output or in any file it wrote), the right exit code, nothing lost (the result
or the trials written; a retry stores each item exactly once), and no process left behind (every command runs
with a tag in its environment that all its processes inherit; none may be alive after the fault).

``bench/faults.py [NAME...]`` runs a subset, ``--list`` lists them; the table and the last line
"N of M faults handled" are docs/reliability.md's section "Fault catalogue"; the exit code is 0 only if
every fault was handled. The faults live in bench/faults_bench.py and bench/faults_campaign.py, the harness
in bench/faults_kit.py.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import faults_bench as fb
import faults_campaign as fc
from faults_kit import SECRET, TRACEBACK, Ctx, FaultSetupError, Warehouse, left_behind, secret_shown


@dataclass(frozen=True)
class Fault:
    name: str
    did: str  # what was done, for the table
    run: Callable[[Ctx], tuple[str, int]]  # (what the user saw, exit code); its checks go to the Ctx


FAULTS = [
    Fault("engine_killed_mid_bench", "`bench` (4 streams, 400 + 2 warm-up requests) on `sim serve`; SIGKILL to the "
          "engine's process group after 8 requests", fb.engine_killed_mid_bench),
    Fault("engine_frozen_mid_bench", "`bench --idle-timeout 2` (14 + 2 warm-up requests) on `sim serve`; SIGSTOP to "
          "the engine's group after 6; it stays frozen", fb.engine_frozen_mid_bench),
    Fault("http_500_every_third", "`bench` (30 + 2 warm-up requests) on a server answering HTTP 500 to every "
          "third request", fb.http_500_every_third),
    Fault("every_request_503", "`bench` on a server answering HTTP 503 (overloaded) to every request",
          fb.every_request_503),
    Fault("endless_line", "`bench --timeout-s 30` on a server whose 4th and 9th streams are one `data:` line that"
          " never ends (1 MiB a write); the client's RSS sampled every 50 ms", fb.endless_line),
    Fault("unbounded_answers", "`bench --timeout-s 30` (16 + 2 warm-up requests) on a server whose streams 4, 7, "
          "10, 13, 16 never end, each its own way: short lines in one open event, JSON arrays opening, an HTTP 500 "
          "body, headers, one `data:` line", fb.unbounded_answers),
    Fault("stream_cut_mid_way", "`bench` on a server that closes every fourth connection after 2 chunks",
          fb.stream_cut_mid_way),
    Fault("engine_killed_mid_campaign", "live `tune` (sim engine); SIGKILL to the engine's group 0.5 s into the "
          "ramp level 4 trial", fc.engine_killed_mid_campaign),
    Fault("tune_sigterm_then_resume", "live `tune`; SIGTERM to it during the ramp; then `tune --resume`",
          fc.tune_sigterm_then_resume),
    Fault("tune_sigkill_then_resume", "live `tune`; SIGKILL to it (no handler runs) during the ramp; then "
          "`tune --resume`", fc.tune_sigkill_then_resume),
    Fault("two_resumes_at_once", "a campaign paused by `--stop-after`; `tune --resume` twice, the second while "
          "the first runs", fc.two_resumes_at_once),
    Fault("serve_killed_escaped_worker", "`serve` of the fake SGLang (2 workers + 1 in its own session); SIGKILL"
          " to `serve`", fc.serve_killed_escaped_worker),
    Fault("engine_died_under_serve", "`serve` of the fake SGLang (2 workers + 1 in its own session); SIGKILL to "
          "the engine's leader only", fc.engine_died_under_serve),
    Fault("pg_stopped_before_load", "`pg_ctl stop`, then `load` of a 3-trial campaign; start, `load` again",
          fc.pg_stopped_before_load),
    Fault("pg_frozen_mid_load", "`load` (response_timeout 4 s); its backend SIGSTOPped mid-statement; thaw, "
          "`load` again", fc.pg_frozen_mid_load),
    Fault("warehouse_lock_held", "`LOCK TABLE experiments` held by another session; `load` (lock_timeout 1 s); "
          "release, `load` again", fc.warehouse_lock_held),
    Fault("port_in_use_sim", "`sim serve --port P` with P bound and listening", fb.port_in_use_sim),
    Fault("port_in_use_serve", "`serve --engine sim --port P` with P bound and listening", fb.port_in_use_serve),
    Fault("out_read_only", "`bench --out` into a read-only tmpfs mount", fb.out_read_only),
    Fault("disk_full_at_write", "`bench --out` on a 16 KiB tmpfs: the disk fills while the result is written",
          fb.disk_full_at_write),
]


@dataclass
class Row:
    fault: Fault
    saw: str
    code: int | None
    problems: list[str]
    seconds: float


def run_one(fault: Fault) -> Row:
    t0 = time.monotonic()
    with TemporaryDirectory(prefix=f"fault-{fault.name}-") as tmp:
        ctx = Ctx(Path(tmp))
        saw, code = "(nothing)", None
        try:
            saw, code = fault.run(ctx)
        except FaultSetupError as exc:
            ctx.problems.append(f"not provoked as designed: {exc}")
        except Exception as exc:  # noqa: BLE001 - a bug of the catalogue, shown as such
            ctx.problems.append(f"catalogue error: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        finally:
            ctx.finish_all()
        if any(TRACEBACK in o.stdout + o.stderr for o in ctx.outcomes):
            ctx.problems.append("a Python traceback was printed")
        if shown := secret_shown(ctx):
            ctx.problems.append(f"the secret is shown in {', '.join(shown)}")
        if left := left_behind(ctx.tag):
            ctx.problems.append(f"left behind: {'; '.join(left)}")
        saw = saw.replace(tmp, "$TMP")
    return Row(fault, saw, code, [p.replace(tmp, "$TMP") for p in ctx.problems], time.monotonic() - t0)


def table(rows: list[Row]) -> str:
    def cell(text: str, width: int = 0) -> str:
        text = " ".join(text.split()).replace(SECRET, "***")
        text = text if not width or len(text) <= width else text[: width - 1] + "…"
        return text.replace("|", "\\|").replace("`", "'")

    out = ["| fault | what was done | what the user saw (first line, trimmed) | exit code | handled | seconds |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        handled = "yes" if not r.problems else "**no**: " + cell("; ".join(r.problems))
        did = r.fault.did.replace("|", "\\|")
        out.append(f"| {r.fault.name} | {did} | {cell(r.saw, 200)} | {r.code} | {handled} | {r.seconds:.1f} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for f in FAULTS:
            print(f"{f.name}: {f.did}")
        return 0
    unknown = set(argv) - {f.name for f in FAULTS}
    if unknown:
        print(f"unknown fault(s): {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        rows = []
        for fault in [f for f in FAULTS if not argv or f.name in argv]:
            rows.append(run_one(fault))
            print(f"{fault.name}: {'handled' if not rows[-1].problems else 'NOT handled'} "
                  f"({rows[-1].seconds:.1f} s)", file=sys.stderr, flush=True)
    finally:
        Warehouse.close()
    print(table(rows))
    handled = sum(not r.problems for r in rows)
    print(f"\n{handled} of {len(rows)} faults handled (in {time.monotonic() - t0:.0f} s)")
    return 0 if handled == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
