"""How noisy a measurement was: the CPU lost to other tenants, the machine's speed before and
after, and the spread of the steps.

A timing taken while a shared machine's other tenants hold its cores is not the plan's timing.
Every run (and calibration) records, beside its figures:

* **steal** - the share of CPU time the hypervisor gave to other tenants during the
  measurement (the ``steal`` column of ``/proc/stat``; ``None`` where there is none);
* **canary** - a fixed small computation timed before and after: its change says whether the
  machine ran at the same speed at both ends (a contended core also slows it without steal);
* **spread** - the steps' median, minimum and maximum, and their interquartile range over the
  median.

:func:`verdict` turns those into one line when any of them is above its threshold
(:data:`THRESHOLDS`), so a noisy comparison is never shown as if it were clean.

>>> spread([1.0, 1.1, 0.9, 1.0])["median_s"]
1.0
>>> verdict({"steal": 0.2, "canary_change": 0.0, "spread": {"iqr_rel": 0.01}})[:15]
'noisy timing: 2'
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

__all__ = ["THRESHOLDS", "cpu_times", "steal_between", "canary", "spread", "Monitor",
           "verdict"]

#: above these a measurement is called noisy: 5 % of the CPU stolen, the canary 10 % slower or
#: faster at the end than at the start, the steps' interquartile range 25 % of their median
THRESHOLDS = {"steal": 0.05, "canary_change": 0.10, "iqr_rel": 0.25}

_STAT = Path("/proc/stat")


def cpu_times(stat: str | None = None) -> tuple | None:
    """``(total, steal)`` jiffies of all CPUs from ``/proc/stat`` (or the text ``stat``);
    ``None`` where the file or its steal column is missing."""
    try:
        text = stat if stat is not None else _STAT.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            vals = [int(x) for x in parts[1:]]
            if len(vals) < 8:
                return None
            # user nice system idle iowait irq softirq steal [guest guest_nice]: guests are
            # already counted in user and nice
            return float(sum(vals[:8])), float(vals[7])
    return None


def steal_between(before, after) -> float | None:
    """The share of CPU time stolen between two :func:`cpu_times` readings."""
    if before is None or after is None:
        return None
    total = after[0] - before[0]
    if total <= 0:
        return 0.0
    return max(0.0, min(1.0, (after[1] - before[1]) / total))


_A = None


def canary(repeats: int = 9) -> float:
    """Seconds of a fixed computation (four 200×200 float64 matrix products, about a
    millisecond), the minimum of ``repeats`` timings: on a quiet machine the same at both ends
    of a measurement."""
    global _A
    if _A is None:
        _A = np.random.default_rng(0).standard_normal((200, 200)) / 16.0
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        x = _A
        for _ in range(4):
            x = x @ _A
        best = min(best, time.perf_counter() - t0)
    return best


def spread(step_times) -> dict:
    """Median, minimum, maximum and interquartile range over the median of the step times."""
    t = np.asarray([float(x) for x in step_times or []], dtype=np.float64)
    if not len(t):
        return {"steps": 0, "median_s": None, "min_s": None, "max_s": None, "iqr_rel": None}
    med = float(np.median(t))
    q1, q3 = np.percentile(t, [25, 75])
    return {"steps": int(len(t)), "median_s": med, "min_s": float(t.min()),
            "max_s": float(t.max()), "iqr_rel": float((q3 - q1) / med) if med > 0 else 0.0}


class Monitor:
    """Brackets a measurement: ``with Monitor() as m: ...`` then ``m.report(step_times)``."""

    def __enter__(self):
        self.canary_before = canary()
        self.before = cpu_times()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.after = cpu_times()
        self.canary_after = canary()
        return False

    def report(self, step_times=None) -> dict:
        """``{"steal", "canary_before_s", "canary_after_s", "canary_change", "spread",
        "wall_s", "noisy", "note"}``."""
        change = (self.canary_after - self.canary_before) / self.canary_before \
            if self.canary_before > 0 else 0.0
        out = {"steal": steal_between(self.before, self.after),
               "canary_before_s": self.canary_before, "canary_after_s": self.canary_after,
               "canary_change": change, "spread": spread(step_times), "wall_s": self.wall}
        note = verdict(out)
        out["noisy"] = note is not None
        out["note"] = note
        return out


def verdict(noise: dict | None) -> str | None:
    """One line saying why a measurement is noisy, or ``None`` when it is not."""
    if not noise:
        return None
    why = []
    steal = noise.get("steal")
    if steal is not None and steal > THRESHOLDS["steal"]:
        why.append(f"{steal * 100:.0f} % of the CPU went to other tenants (steal)")
    change = noise.get("canary_change")
    if change is not None and abs(change) > THRESHOLDS["canary_change"]:
        why.append(f"the machine ran {abs(change) * 100:.0f} % "
                   f"{'slower' if change > 0 else 'faster'} at the end than at the start")
    iqr = (noise.get("spread") or {}).get("iqr_rel")
    if iqr is not None and iqr > THRESHOLDS["iqr_rel"]:
        why.append(f"the steps varied by {iqr * 100:.0f} % of their median (interquartile)")
    if not why:
        return None
    return "noisy timing: " + "; ".join(why) + " - compare these timings with care"
