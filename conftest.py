"""Test tiers, for every test the suite collects (``tests/`` and the package's doctests).

* ``browser`` (the real app in headless Chromium) and ``multiprocess`` (worker processes,
  servers, the command line in a subprocess) are marked in their modules;
* ``slow`` is added here to every browser and multi-process test, and written on the unit tests
  that take more than a few seconds;
* ``python -m pytest -m "not slow"`` is the fast tier; ``bash scripts/test.sh`` runs all,
  on two pytest-xdist workers; the browser tests (and the server tests, which check port 8050
  is free) share one xdist group so that only one app server is up at a time.
"""

import pytest


#: test modules that start a server on (or check) the app's default port
_ONE_SERVER_MODULES = {"test_serve"}


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    one_server = pytest.mark.xdist_group("one-app-server")
    for item in items:
        browser = item.get_closest_marker("browser") is not None
        if browser or item.get_closest_marker("multiprocess") is not None:
            item.add_marker(slow)
        module = getattr(getattr(item, "module", None), "__name__", "")
        if browser or module.rpartition(".")[2] in _ONE_SERVER_MODULES:
            item.add_marker(one_server)
