"""``python -m servetune`` == the ``servetune`` command (used to start the simulated engine portably)."""

from servetune.cli import app

app()
