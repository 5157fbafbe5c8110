"""A real SMTP server on loopback (aiosmtpd) for the tests of what Airflow's notifiers send."""

from __future__ import annotations

import json
from email import message_from_bytes, policy
from email.message import Message

from aiosmtpd.controller import Controller as SMTPController

from servetune.runners.preflight import free_port


class Sink:
    """An SMTP handler that keeps what it receives (aiosmtpd: a real SMTP server)."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        self.messages.append(message_from_bytes(envelope.original_content, policy=policy.default))
        return "250 OK"


def mail_sink(setup) -> tuple[Sink, SMTPController]:
    """A real SMTP server on loopback, started, and the Airflow connection smtp_default pointing at it."""
    mails = Sink()
    smtp = SMTPController(mails, hostname="127.0.0.1", port=free_port())
    smtp.start()
    setup.extra_env["AIRFLOW_CONN_SMTP_DEFAULT"] = json.dumps(
        {"conn_type": "smtp", "host": "127.0.0.1", "port": smtp.port,
         "extra": {"disable_tls": True, "disable_ssl": True}})
    return mails, smtp
