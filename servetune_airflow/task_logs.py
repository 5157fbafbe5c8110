"""Task logs at INFO that read like the CLI: servetune's lines (one per trial, one per stage), not the
libraries' chatter (an HTTP line per health poll, Great Expectations loading its context per trial).

Airflow sets the task's root level (``[logging] logging_level``, INFO under ``servetune airflow``); this
raises the named libraries to WARNING in the task process. ``SERVETUNE_TASK_LOG_LEVEL=DEBUG`` leaves them be.
"""

from __future__ import annotations

import logging
import os

NOISY = ("great_expectations", "httpx", "httpcore", "urllib3", "alembic", "asyncio", "filelock", "matplotlib",
         "PIL", "fsspec", "numexpr")


def quiet_libraries() -> None:
    if os.environ.get("SERVETUNE_TASK_LOG_LEVEL", "").upper() == "DEBUG":
        return
    for name in NOISY:
        logging.getLogger(name).setLevel(logging.WARNING)
