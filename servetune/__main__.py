"""``python -m servetune`` == the ``servetune`` command (used to start the simulated engine portably).

The program name is fixed so that usage errors read ``see: servetune bench --help`` either way.
"""

from servetune.cli import app

if __name__ == "__main__":
    app(prog_name="servetune")
