"""Fingerprints of models and prompt templates over time (the watcher's memory).

A change is a digest that differs from the latest one stored for the same asset; the first
sighting of an asset is recorded as its baseline, not reported as a change.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select

from servetune.fingerprint import Fingerprint
from servetune.warehouse import db
from servetune.warehouse.tables import asset_fingerprints


def latest_digest(conn, uri: str) -> str | None:
    row = conn.execute(
        select(asset_fingerprints.c.digest)
        .where(asset_fingerprints.c.asset_uri == uri)
        .order_by(asset_fingerprints.c.seen_at.desc(), asset_fingerprints.c.id.desc())
        .limit(1)
    ).first()
    return row[0] if row else None


def record_fingerprint(url: str, uri: str, fp: Fingerprint) -> dict[str, Any]:
    """Store the fingerprint when it is new for this asset; say whether it is a change."""
    eng = db.engine(url)
    try:
        with eng.begin() as conn:
            previous = latest_digest(conn, uri)
            if previous != fp.digest:
                conn.execute(insert(asset_fingerprints).values(
                    asset_uri=uri, kind=fp.kind, source=fp.source, digest=fp.digest, parts=list(fp.parts)))
    finally:
        eng.dispose()
    return {"uri": uri, "digest": fp.digest, "previous": previous,
            "changed": previous is not None and previous != fp.digest}
