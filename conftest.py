"""Test tiers, for every test the suite collects (``tests/`` and the package's doctests).

* ``browser`` (the real app in headless Chromium) and ``multiprocess`` (worker processes,
  servers, the command line in a subprocess) are marked in their modules;
* ``slow`` is added here to every browser and multi-process test, and written on the unit tests
  that take more than a few seconds;
* ``python -m pytest -m "not slow"`` is the fast tier; ``bash scripts/test.sh`` runs all.

With pytest-xdist (``--dist loadgroup``) every test file is one unit of work, so a module's
fixtures run once; a module may split itself into units with its own ``xdist_group`` marks
(the Tofu example runs: one unit per worker count).  Browser tests take a free port each
(``tests/conftest.py``), so browser files run side by side.
"""

import pytest


@pytest.hookimpl(tryfirst=True)      # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        browser = item.get_closest_marker("browser") is not None
        if browser or item.get_closest_marker("multiprocess") is not None:
            item.add_marker(slow)
        if item.get_closest_marker("xdist_group") is None:   # a module may split itself
            item.add_marker(pytest.mark.xdist_group(item.nodeid.partition("::")[0]))
