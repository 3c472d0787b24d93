"""Shared pytest fixtures."""

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shakespeare_cache(tmp_path_factory):
    """A cache folder holding the real Tiny Shakespeare, set as $GPT2LADDER_CACHE for the session.

    The text is copied from the shared data folder, never downloaded: tests run without network.
    Session-scoped so the real text is tokenized once per test run.
    """
    repo = Path(__file__).resolve().parents[1]
    candidates = [repo.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"]
    source = next((p for p in candidates if p.is_file()), None)
    if source is None:
        pytest.skip(f"real Tiny Shakespeare not found at {candidates[0]}")
    cache = tmp_path_factory.mktemp("gpt2ladder-cache")
    (cache / "tinyshakespeare").mkdir()
    shutil.copyfile(source, cache / "tinyshakespeare" / "input.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT2LADDER_CACHE", str(cache))
        yield cache
