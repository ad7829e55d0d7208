"""Two processes through one search's independent steps (issue 28).

A search that costs many independent configurations (the pipeline search's stage and
micro-batch counts) runs them on the calling process and on one child forked from it.  Both
run the same code from the fork on: each claims the next unclaimed item of a list from a
shared counter (:meth:`Pair.claims`), both see the best objective either has found
(:meth:`Pair.best`, :meth:`Pair.offer`), and they swap what they computed
(:meth:`Pair.exchange`).  The numbers each item gets do not depend on which process computed
it; only what the shared best lets a process skip depends on timing.

:func:`team` gives a :class:`Pair` where it pays and is safe (Linux's ``fork``, at least two
usable cores, asked for two processes) and a :class:`Solo` otherwise, which runs the same
code in the calling process alone, every item in order.

The child never returns into the caller's code: the caller ends it with :meth:`Pair.close`
(``os._exit`` after its last message, so no buffered output or exit handler of the parent
runs twice).  It dies with its parent (``PR_SET_PDEATHSIG``), and the parent kills and reaps
it on any error, so that no search leaves a process behind.

>>> t = team(1)
>>> [i for i in t.claims(3)], t.exchange("mine"), t.best()
([0, 1, 2], ['mine'], inf)
>>> t.offer(2.5); t.best()
2.5
"""

from __future__ import annotations

import math
import mmap
import os
import signal
import sys

import numpy as np

#: the environment variable that caps the processes a search forks (``1``: none)
PROCESSES_ENV = "EXPLORER_SEARCH_PROCESSES"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def team(processes: int | None = None, prepare=None) -> "Solo | Pair":
    """Two processes (:class:`Pair`) when ``processes`` (``None``: as many as there are
    usable cores, at most 2, capped by :data:`PROCESSES_ENV`) is at least 2 and this is
    Linux; else :class:`Solo`.  ``prepare()`` runs just before a fork (what both processes
    need, loaded once)."""
    want = min(2, usable_cores()) if processes is None else int(processes)
    cap = os.environ.get(PROCESSES_ENV, "").strip()
    if cap.isdigit():
        want = min(want, int(cap))
    if want < 2 or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return Solo()
    if prepare is not None:
        prepare()
    try:
        return Pair()
    except OSError:                        # no process to spare (EAGAIN, ENOMEM): alone
        return Solo()


class Solo:
    """The calling process alone: every item in order."""

    processes = 1
    child = False

    def __init__(self):
        self._best = math.inf

    def claims(self, n: int, prefer=None, window: int = 2):
        return iter(range(n))

    def best(self) -> float:
        return self._best

    def offer(self, value: float) -> None:
        self._best = min(self._best, float(value))

    def exchange(self, obj) -> list:
        return [obj]

    def send(self, obj) -> None:
        raise RuntimeError("a search in one process has no other process to send to")

    def recv(self):
        raise RuntimeError("a search in one process has no other process to receive from")

    def close(self, error: BaseException | None = None) -> None:
        pass


class Pair:
    """The calling process (``child`` false) and one forked child (``child`` true), both
    running the code that follows the construction."""

    processes = 2
    #: claimed lists, one per :meth:`claims` call
    PHASES = 8
    #: the longest list whose items :meth:`claims` can take out of order (``prefer``)
    FLAGS = 4096

    def __init__(self):
        import multiprocessing
        ctx = multiprocessing.get_context("fork")
        self._lock = ctx.Lock()
        # shared with the child: a counter and taken flags per claimed list, the best
        self._mem = mmap.mmap(-1, 8 * (self.PHASES + 1) + self.PHASES * self.FLAGS)
        self._count = np.frombuffer(self._mem, dtype=np.int64, count=self.PHASES)
        self._best = np.frombuffer(self._mem, dtype=np.float64, count=1,
                                   offset=8 * self.PHASES)
        self._taken = np.frombuffer(self._mem, dtype=np.uint8, count=self.PHASES * self.FLAGS,
                                    offset=8 * (self.PHASES + 1)).reshape(self.PHASES, -1)
        self._best[0] = math.inf
        self._phase = 0
        here, there = ctx.Pipe()
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        self.child = self.pid == 0
        if self.child:
            here.close()
            self._conn = there
            _die_with(parent)
        else:
            there.close()
            self._conn = here

    # -- claiming ----------------------------------------------------------------------------
    def claims(self, n: int, prefer=None, window: int = 2):
        """The indices ``0 .. n − 1`` this process takes, each taken by exactly one process
        (both must call :meth:`claims` in the same sequence), in ascending order; with
        ``prefer`` (indices whose inputs this process already holds) the first preferred one
        among the next ``window`` untaken ones, else the next."""
        c = self._phase
        self._phase += 1
        if c >= self.PHASES:
            raise RuntimeError(f"a pair of processes claims at most {self.PHASES} lists")
        if prefer is None or n > self.FLAGS:
            while True:
                with self._lock:
                    i = int(self._count[c])
                    self._count[c] = i + 1
                if i >= n:
                    return
                yield i
        prefer = set(prefer)
        taken = self._taken[c]
        while True:
            with self._lock:
                free = np.flatnonzero(taken[:n] == 0)[:window].tolist()
                if not free:
                    return
                i = next((j for j in free if j in prefer), free[0])
                taken[i] = 1
            yield i

    def best(self) -> float:
        return float(self._best[0])

    def offer(self, value: float) -> None:
        with self._lock:
            if value < self._best[0]:
                self._best[0] = float(value)

    # -- messages ----------------------------------------------------------------------------
    def exchange(self, obj) -> list:
        """``[the parent's obj, the child's obj]`` in both processes (the child sends first,
        so that large messages cannot block both ends)."""
        if self.child:
            self.send(obj)
            return [self.recv(), obj]
        other = self.recv()
        self.send(obj)
        return [obj, other]

    def send(self, obj) -> None:
        self._conn.send(("ok", obj))

    def recv(self):
        try:
            kind, obj = self._conn.recv()
        except (EOFError, OSError):
            raise RuntimeError("the search's second process ended before it answered "
                               f"({self._status()})") from None
        if kind == "error":
            raise obj
        return obj

    def _status(self) -> str:
        if self.child:
            return "its parent is gone"
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return "already reaped"
        if pid == 0:
            return "still running"
        self.pid = -1
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit status {os.WEXITSTATUS(status)}"

    def close(self, error: BaseException | None = None) -> None:
        """End the pair: the child sends ``error`` (if any) and leaves at once, never
        returning to the caller; the parent reaps the child, killing it first if it is
        still running (an error on the parent's side)."""
        if self.child:
            code = 0
            if error is not None:
                code = 1
                try:
                    self._conn.send(("error", _portable(error)))
                except Exception:                         # noqa: BLE001 - leaving anyway
                    pass
            try:
                self._conn.close()
            finally:
                os._exit(code)
        self._conn.close()
        if self.pid > 0:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
                if pid == 0:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
            except (ChildProcessError, ProcessLookupError):
                pass
            self.pid = -1


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a ``RuntimeError`` with its text."""
    import pickle
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:                                      # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(error).__name__}: {error}")


def _die_with(parent: int) -> None:
    """Have the kernel kill this (child) process when its parent ends."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))                 # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:                             # the parent ended before that
        os._exit(1)
