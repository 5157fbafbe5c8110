"""Kill an engine's whole process tree once the process that started it is gone.

Why a separate process: a parent killed with SIGKILL runs no cleanup (no ``finally``, no atexit),
and PR_SET_PDEATHSIG reaches only the direct child, not the engine's own workers. Started by
``servetune.runners.process`` as a plain script (stdlib only, fast to start), in its own session
so that killing the engine's group does not kill it. Usage: watchdog.py PARENT_PID PGID GRACE_S TAG

The tree is the engine's process group plus every process whose environment carries
``SERVETUNE_ENGINE_TREE=TAG`` (set on the engine, inherited by its workers): a worker that left the
group (its own ``setsid``) and was orphaned when the engine's leader died is found by its tag.
"""

import os
import select
import signal
import sys
import time

TAG_VAR = "SERVETUNE_ENGINE_TREE"


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tagged(tag):
    """PIDs of live processes (not this one) whose environment holds TAG_VAR=tag (readable: ours, or root)."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _signal_tree(pgid, tag, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in tagged(tag):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_tree(pgid, tag, grace_s):
    _signal_tree(pgid, tag, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (_group_alive(pgid) or tagged(tag)):
        time.sleep(0.1)
    _signal_tree(pgid, tag, signal.SIGKILL)


def main():
    parent, pgid, grace_s, tag = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the parent
    try:
        pidfd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is None and os.getppid() != parent:
        _kill_tree(pgid, tag, grace_s)
        return 0
    while _group_alive(pgid) or tagged(tag):  # the tag scan runs only once the group is gone
        if pidfd is not None:
            parent_gone = bool(select.select([pidfd], [], [], 1.0)[0])
        else:
            time.sleep(0.5)
            parent_gone = os.getppid() != parent
        if parent_gone:
            _kill_tree(pgid, tag, grace_s)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
