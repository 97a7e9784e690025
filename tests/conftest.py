"""Shared fixtures: an isolated output cache, and the location of the shared real data."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own backbone-output cache, never the user's ~/.cache."""
    monkeypatch.setenv("SELBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("selbench-cache")))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real model outputs not available: {SHARED_DATA} is absent")
    return SHARED_DATA
