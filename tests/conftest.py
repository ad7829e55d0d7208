"""Shared fixtures: every test runs with its own EXPLORER_HOME (profile cache, plan history,
background-callback cache), so tests never touch the user's files or each other's."""

import pytest


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("explorer-home")
    monkeypatch.setenv("EXPLORER_HOME", str(home))
    yield home
