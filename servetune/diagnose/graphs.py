"""Rule 7: decode batches that ran outside the CUDA graphs.

SGLang replays a captured CUDA graph for a decode batch of up to ``--cuda-graph-max-bs`` requests and runs a
bigger one eagerly, every kernel launched on its own; its scheduler log says which on every decode line
(``cuda graph: True/False``, read into ``summary.sched_cuda_graph_fraction``). A step outside the graphs is
slower, so requests finish later and the batch grows further: on an H100 a VLM service at 14-16 req/s either
kept every logged decode batch in its graphs (p99 TPOT under 45 ms) or fell far behind with a fifth to two
thirds of them outside (52-116 ms; docs/gpu.md, "The eleventh window"). Capturing graphs for bigger batches
costs start-up time and memory, so the advice names the trade, not a number.
"""

from __future__ import annotations

from servetune.diagnose import Finding, flag, r3
from servetune.result import TrialResult

OUTSIDE_WARN = 0.1  # share of logged decode batches outside the graphs at or above: warning (below: info)


def diagnose(result: TrialResult) -> list[Finding]:
    s = result.summary
    inside = s.sched_cuda_graph_fraction
    if inside is None or inside >= 1.0:
        return []
    outside, cap = 1.0 - inside, flag(result, "cuda_graph_max_bs")
    running = f"; {s.sched_decode_running_mean:.0f} running on average" if s.sched_decode_running_mean else ""
    now = f" (now {cap})" if cap is not None else ""
    return [Finding(
        trial_id=result.trial_id, kind="graphs.decode_outside",
        severity="warning" if outside >= OUTSIDE_WARN else "info",
        evidence={"cuda_graph_fraction": r3(inside), "decode_lines": s.sched_decode_lines,
                  "decode_running_mean": r3(s.sched_decode_running_mean), "cuda_graph_max_bs": cap,
                  "p99_tpot_ms": r3(s.tpot_ms.p99)},
        summary=f"{outside:.0%} of the {s.sched_decode_lines or 0} logged decode batches ran outside the CUDA graphs"
                f" (more requests running than --cuda-graph-max-bs{now}{running}): each of those steps is slower",
        advice=f"raise --cuda-graph-max-bs{now} above the batch this load reaches (more start-up time and memory for"
               " the captures), or offer less: a server pushed out of its graphs by a burst can fall behind for good")]
