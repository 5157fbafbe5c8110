"""Kill an engine's process group once the process that started it is gone.

Why a separate process: a parent killed with SIGKILL runs no cleanup (no ``finally``, no atexit),
and PR_SET_PDEATHSIG reaches only the direct child, not the engine's own workers. Started by
``servetune.runners.process`` as a plain script (stdlib only, fast to start), in its own session
so that killing the engine's group does not kill it. Usage: watchdog.py PARENT_PID PGID GRACE_S
"""

import os
import select
import signal
import sys
import time


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pgid: int, grace_s: float) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> int:
    parent, pgid, grace_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the parent
    try:
        pidfd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is None and os.getppid() != parent:
        _kill_group(pgid, grace_s)
        return 0
    while _group_alive(pgid):
        if pidfd is not None:
            parent_gone = bool(select.select([pidfd], [], [], 1.0)[0])
        else:
            time.sleep(0.5)
            parent_gone = os.getppid() != parent
        if parent_gone:
            _kill_group(pgid, grace_s)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
