"""Issue 44's bad inputs, part of bench/bad_inputs.py's catalogue: a plan's name used as a path or as terminal
text, and work that grows with the input (ramp levels, the refine grid), each refused when the plan is read
(servetune.names, servetune.numbers; docs/reliability.md, "Inputs from outside are bounded"). The network,
schema and OS-error classes need a server, a database or a disk in a given state: they are tests
(tests/test_reliability_faults.py, tests/test_warehouse_schema.py) and the fault catalogue's ``endless_line``.
"""

from __future__ import annotations

from typing import Any

LABEL = "is a label, not a path"
CONTROL = "control character"
RAMP, GRID = "stages.ramp.levels", "stages.refine.grid"

#: (name, plan patch, words the message names): each runs ``servetune tune plan.yaml --dry-run``
PLAN: list[tuple[str, Any, tuple[str, ...]]] = [
    # the variants the issue names
    ("name_absolute_path", {"name": "/tmp-abs-name"}, ("name", LABEL)),
    ("name_parent_dirs", {"name": "../../../escaped-by-name"}, ("name", LABEL)),
    ("name_ansi_and_newline", {"name": "evil\x1b[2J\nname"}, ("name", CONTROL, "\\x1b")),
    ("name_300_characters", {"name": "n" * 300}, ("name", "300 characters", "at most 100")),
    ("grid_two_flags_5000_values", {"stages": {"refine": {"grid": {"chunked-prefill-size": list(range(1, 5001)),
                                                                   "schedule-conservativeness": [0.5, 1.0]}}}},
     (GRID, "5002 values", "at most 128")),
    # our own, names
    ("name_dot_dot", {"name": ".."}, ("name", LABEL)),
    ("name_inner_slash", {"name": "team/llama"}, ("name", LABEL)),
    ("name_backslash", {"name": "C:\\runs\\x"}, ("name", LABEL)),
    ("name_tab", {"name": "a\tb"}, ("name", CONTROL)),
    ("name_trailing_blank", {"name": "llama "}, ("name", "blanks")),
    ("name_delete_char", {"name": "del\x7fete"}, ("name", CONTROL)),
    # our own, sizes
    ("ramp_200_levels", {"stages": {"ramp": {"levels": list(range(20, 220))}}}, (RAMP, "at most 64")),
    ("grid_one_flag_65_values", {"stages": {"refine": {"grid": {"chunked-prefill-size": list(range(1, 66))}}}},
     (GRID, "65 values", "at most 64")),
    ("grid_129_values_in_all", {"stages": {"refine": {"grid": {
        "chunked-prefill-size": list(range(1, 65)), "schedule-conservativeness": [x / 100 for x in range(1, 66)]}}}},
     (GRID, "129 values", "at most 128")),
    ("grid_200_by_200", {"stages": {"refine": {"grid": {"chunked-prefill-size": list(range(1, 201)),
                                                        "max-running-requests": list(range(1, 201))}}}},
     (GRID, "400 values")),
    ("ramp_100k_levels_as_text", {"stages": {"ramp": {"levels": list(range(1, 100_001))}}}, (RAMP, "at most 64")),
]
