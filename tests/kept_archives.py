"""Kept GPU campaigns live in tests/data as .tar.xz (their trial files hold every request record): one way to
unpack them for a replay, shared by the tests that replay them."""

from __future__ import annotations

import tarfile
from pathlib import Path

from servetune.tuning.state import CampaignState


def unpack(root: Path, *archives: Path) -> Path:
    """Each archive unpacked into ``root`` (data-only: no links out, no device files); ``root`` back."""
    for archive in archives:
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
    return root


def kept_state(folder: Path) -> CampaignState:
    """A kept campaign's state.json, read as the tuner reads it."""
    return CampaignState.model_validate_json((folder / "state.json").read_bytes())
