"""The service's caches: small LRUs whose values are built once even when many callbacks ask.

Dash serves callbacks from threads (and background callbacks from forked processes), so two
callbacks often want the same capture or result at once; :class:`Cache` builds it once and
the other waits.  Captures (torch.fx, make_fx) are not thread-safe, so they also hold
:func:`capturing`'s lock.  Every cache registers itself, so :func:`clear_all` empties them and
a forked child starts with fresh locks.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Callable

__all__ = ["Cache", "captured", "clear_all"]

_LOCK = threading.RLock()            # guards every cache's entries and builders
_CAPTURE = threading.Lock()          # torch.fx tracing is not thread-safe: one capture at a time
_CACHES: list = []


class Cache:
    """An LRU of at most ``size`` values, each built by ``make()`` once: a per-key lock
    serialises builders of the same key (the others wait and reuse the value, or see the
    builder's error themselves); different keys build in parallel."""

    def __init__(self, name: str, size: int = 8):
        self.name = name
        self.size = size
        self.items: OrderedDict = OrderedDict()
        self.building: dict = {}         # key -> lock held while that value is being built
        _CACHES.append(self)

    def get(self, key, make: Callable, valid: Callable | None = None):
        """``self[key]``, built by ``make()`` when missing (or when ``valid(value)`` is
        false: a value made from a capture that has since been rebuilt)."""
        while True:
            with _LOCK:
                if key in self.items and (valid is None or valid(self.items[key])):
                    self.items.move_to_end(key)
                    return self.items[key]
                building = self.building.setdefault(key, threading.Lock())
            with building:
                with _LOCK:
                    if key in self.items and (valid is None or valid(self.items[key])):
                        self.items.move_to_end(key)
                        return self.items[key]
                    if self.building.get(key) is not building:
                        continue           # the builder failed or the cache was cleared
                try:
                    value = make()
                except BaseException:
                    with _LOCK:            # waiters retry (and see the same error themselves)
                        if self.building.get(key) is building:
                            del self.building[key]
                    raise
                with _LOCK:                # publish and release in one step
                    if self.building.get(key) is building:
                        del self.building[key]
                        self.items[key] = value
                        self.items.move_to_end(key)
                        while len(self.items) > self.size:
                            self.items.popitem(last=False)
                return value

    def drop(self, keep: Callable) -> None:
        """Forget every entry whose key ``keep(key)`` rejects."""
        with _LOCK:
            for key in [k for k in self.items if not keep(k)]:
                del self.items[key]

    def clear(self) -> None:
        with _LOCK:
            self.items.clear()
            self.building.clear()

    def __contains__(self, key) -> bool:
        with _LOCK:
            return key in self.items

    def __len__(self) -> int:
        return len(self.items)


def captured(build: Callable) -> Callable:
    """``build`` wrapped to run under the one capture lock."""
    def make():
        with _CAPTURE:
            return build()
    return make


def clear_all() -> None:
    """Empty every cache."""
    for cache in _CACHES:
        cache.clear()


def _after_fork_in_child():
    global _LOCK, _CAPTURE
    _LOCK = threading.RLock()          # a forked background job must not inherit a held lock
    _CAPTURE = threading.Lock()
    for cache in _CACHES:
        cache.building.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
