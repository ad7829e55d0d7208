"""A per-worker memory limit (``explorer run PLAN --memory-per-worker GiB``).

Two checks, one number:

* **before launch** (:func:`check_predicted`): a plan whose predicted per-worker peak (the
  document's ``peak_memory_bytes`` / ``memory_per_device_bytes``) is over the limit is refused
  with one line, and no worker starts;
* **during the run** (:class:`MemoryGuard`, in every worker): once a worker has built its
  model and joined its group it arms the guard (and disarms it after its last step, before
  the result is gathered), which measures what the worker's steps allocate beyond that point - anonymous resident memory (``RssAnon``: tensors, buffers,
  received parts; not code pages) - from a watchdog thread every few milliseconds, and sets
  ``RLIMIT_DATA`` a little above the limit so that even a burst between two looks fails its
  allocation.  Either way the worker reports one clear line and exits; the launcher then kills
  every other worker (:func:`.launcher.start_workers`), so nothing is left behind.
"""

from __future__ import annotations

import os
import threading

from explorer.errors import InfeasiblePlan

GiB = 1024 ** 3
#: RLIMIT_DATA's headroom over the limit: thread stacks and allocator arenas the process
#: maps for itself (a backstop; the watchdog enforces the limit itself)
SLACK = 64 * 1024 ** 2


def parse_gib(value) -> float | None:
    """``--memory-per-worker`` in GiB → bytes (``None`` stays ``None``); > 0 or
    :class:`InfeasiblePlan`."""
    if value is None:
        return None
    try:
        gib = float(value)
    except (TypeError, ValueError):
        raise InfeasiblePlan(f"--memory-per-worker {value!r} is not a number of GiB") from None
    if not gib > 0 or gib != gib or gib == float("inf"):
        raise InfeasiblePlan(f"--memory-per-worker must be a positive number of GiB, got "
                             f"{value}")
    return gib * GiB


def predicted_peak(doc: dict) -> list:
    """The plan's predicted per-worker peak bytes (``peak_memory_bytes``, else the common
    ``memory_per_device_bytes``); ``[]`` when the document has neither."""
    for key in ("peak_memory_bytes", "memory_per_device_bytes"):
        v = doc.get(key)
        if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
            return [float(x) for x in v]
    return []


def check_predicted(doc: dict, limit: float) -> None:
    """Refuse (one line) a plan whose predicted per-worker peak is over ``limit`` bytes."""
    peaks = predicted_peak(doc)
    if not peaks:
        raise InfeasiblePlan("--memory-per-worker: the plan predicts no per-worker memory "
                             "(peak_memory_bytes); save it again with `explorer search --out`")
    worst = max(range(len(peaks)), key=peaks.__getitem__)
    if peaks[worst] > limit:
        raise InfeasiblePlan(
            f"the plan needs {peaks[worst] / GiB:.3g} GiB on worker {worst} (predicted peak), "
            f"over --memory-per-worker {limit / GiB:.3g} GiB: give more memory, more workers "
            f"or a smaller batch")


def _anon_bytes() -> int:
    """This process's anonymous resident memory (Linux ``RssAnon``; RSS elsewhere)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil
    return int(psutil.Process().memory_info().rss)


def _return_freed_memory() -> None:
    """Make freed tensors leave the process (glibc): blocks of 128 KiB and more are mapped
    on their own and unmapped when freed - without this glibc raises that threshold as the
    step frees large blocks and keeps them, so the resident memory the guard watches would
    exceed what the step holds - and what is free now is returned before the baseline."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)               # M_MMAP_THRESHOLD (fixes it)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass                                       # not glibc: the guard still works


def _vm_data() -> int | None:
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class MemoryGuard:
    """Stops this worker when its steps allocate more than ``limit`` bytes (see the module).

    ``report(message)`` tells the launcher (then the process exits with status 3)."""

    def __init__(self, limit: float, rank: int, report, interval_s: float = 0.005):
        self.limit, self.rank, self.report = float(limit), int(rank), report
        self.interval_s = float(interval_s)
        self.base = None
        self._stop = threading.Event()
        self._saved = None             # RLIMIT_DATA before arm()
        self.scale = 1.0               # this pass may allocate scale × limit

    def arm(self, scale: float = 1.0) -> None:
        """Measure from now: the baseline is what the worker holds after setting up.
        ``scale``: these steps may allocate ``scale`` × the limit (a float64 check pass of
        steps the plan counts at 4 bytes an element); a disarmed guard can be armed again."""
        if self.base is not None and not self._stop.is_set():
            return
        self._stop = threading.Event()
        self.scale = float(scale)
        _return_freed_memory()
        self.base = _anon_bytes()
        data = _vm_data()
        if data is not None:
            try:
                import resource
                old, hard = resource.getrlimit(resource.RLIMIT_DATA)
                soft = int(data + self.limit * self.scale + SLACK)
                if hard == resource.RLIM_INFINITY or soft <= hard:
                    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
                    self._saved = (old, hard)
            except (ImportError, ValueError, OSError):
                pass
        threading.Thread(target=self._watch, args=(self._stop,), name="explorer-memory-guard",
                         daemon=True).start()

    def used(self) -> int:
        """Bytes allocated since :meth:`arm` (0 before)."""
        return 0 if self.base is None else max(0, _anon_bytes() - self.base)

    def message(self, used: float | None = None) -> str:
        what = (f"its steps allocated {used / GiB:.3g} GiB" if used is not None else
                "an allocation was refused")
        if self.scale != 1.0:
            what = (f"its float64 check steps allocated {used / GiB:.3g} GiB (counted at "
                    f"1/{self.scale:g})" if used is not None else what)
        return (f"{what}, over --memory-per-worker {self.limit / GiB:.3g} GiB; the run was "
                f"stopped")

    def translate(self, exc: BaseException) -> str | None:
        """The guard's message for an allocation failure ``RLIMIT_DATA`` caused, else None."""
        if self.base is None:
            return None
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, MemoryError) or "can't allocate memory" in text or \
                "Cannot allocate memory" in text:
            return self.message()
        return None

    def _watch(self, stop) -> None:
        while not stop.wait(self.interval_s):
            u = self.used()
            if u > self.limit * self.scale:
                self.report(self.message(u))
                os._exit(3)

    def disarm(self) -> None:
        """Stop watching and lift ``RLIMIT_DATA`` again: the steps are over (what follows -
        gathering the result on rank 0 - is not part of them)."""
        self._stop.set()
        if self._saved is not None:
            import resource
            try:
                resource.setrlimit(resource.RLIMIT_DATA, self._saved)
            except (ValueError, OSError):
                pass
            self._saved = None


_GUARD: MemoryGuard | None = None


def install(limit: float | None, rank: int, report) -> MemoryGuard | None:
    """Create this worker's guard (not armed yet); ``None`` limit: no guard."""
    global _GUARD
    _GUARD = None if limit is None else MemoryGuard(limit, rank, report)
    return _GUARD


def arm(scale: float = 1.0) -> None:
    """Arm this worker's guard, if it has one (executors call it once set up, before the
    first step; ``scale`` as :meth:`MemoryGuard.arm`)."""
    if _GUARD is not None:
        _GUARD.arm(scale)


def disarm() -> None:
    """Disarm this worker's guard, if it has one (executors call it after the last step)."""
    if _GUARD is not None:
        _GUARD.disarm()
