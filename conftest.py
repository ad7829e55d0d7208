"""Test tiers, for every test the suite collects (``tests/`` and the package's doctests).

* ``browser`` (the real app in headless Chromium) and ``multiprocess`` (worker processes,
  servers, the command line in a subprocess) are marked in their modules;
* ``slow`` is added here to every browser and multi-process test, and written on the unit tests
  that take more than a few seconds;
* ``python -m pytest -m "not slow"`` is the fast tier; ``bash scripts/test.sh`` runs all.
"""

import pytest


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        if (item.get_closest_marker("browser") is not None
                or item.get_closest_marker("multiprocess") is not None):
            item.add_marker(slow)
