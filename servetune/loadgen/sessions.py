"""Load units: a request on its own, or a user's session whose turns wait for each other's answers.

A multi-turn workload in ``sessions`` mode (servetune.workload.spec.MultiTurn) is offered as users: the
closed loop's streams and the open loop's arrivals are sessions, and within one the next turn is sent
only once the previous answer has arrived (after the user's think time), with that answer's text in
its history. Everything else is one request per unit, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from servetune.workload.request import WorkloadRequest


def load_units(requests: Sequence[WorkloadRequest]) -> list[list[int]]:
    """Request indices grouped into units, in the order of their first request: a session's turns
    (requests with ``live_history`` of one conversation, in turn order) or a single request."""
    units: list[list[int]] = []
    open_sessions: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        if not r.live_history or r.conversation < 0:
            units.append([i])
            continue
        unit = open_sessions.get(r.conversation)
        if unit is None or r.turn == 0:
            unit = open_sessions[r.conversation] = []
            units.append(unit)
        elif requests[unit[-1]].turn >= r.turn:
            raise ValueError(f"request {i}: session {r.conversation}'s turn {r.turn} comes after its turn"
                             f" {requests[unit[-1]].turn}: a session's turns must be in order")
        unit.append(i)
    return units


def is_session(requests: Sequence[WorkloadRequest], unit: list[int]) -> bool:
    return requests[unit[0]].live_history
