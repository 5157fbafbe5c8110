"""The orphan sweep: processes tagged with an owner (and their process groups) are found and killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from servetune.runners.sweep import OWNER_ENV, owned_processes, sweep

CHILD = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
         " time.sleep(120)")


def test_sweep_kills_tagged_engines_and_their_workers_only():
    owner, other = uuid.uuid4().hex, uuid.uuid4().hex
    mine = subprocess.Popen([sys.executable, "-c", CHILD], env={**os.environ, OWNER_ENV: owner},
                            start_new_session=True)
    theirs = subprocess.Popen([sys.executable, "-c", CHILD], env={**os.environ, OWNER_ENV: other},
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(owned_processes(owner)) < 2 and time.monotonic() < deadline:  # the worker inherits the tag
            time.sleep(0.1)
        assert mine.pid in {p.pid for p in owned_processes(owner)}
        killed = sweep(owner, grace_s=5)
        assert mine.pid in killed and len(killed) == 2
        mine.wait(timeout=5)
        assert owned_processes(owner) == []
        assert theirs.poll() is None and len(owned_processes(other)) >= 1  # another campaign's engine lives
    finally:
        sweep(owner, grace_s=1)
        sweep(other, grace_s=1)
        for p in (mine, theirs):
            p.wait(timeout=10)
