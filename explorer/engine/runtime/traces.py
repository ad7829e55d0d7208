"""Traced steps sent to worker processes: pickled once by the launcher, kept in the capture
cache, unpickled by each worker instead of tracing the model again.

A worker that traces a model's step itself pays seconds to minutes (once per worker); one that
unpickles the launcher's trace pays a fraction of a second.  :func:`shipped` keeps a pickled
trace in the capture cache (kind ``trace``) under everything it was made from - the model's
code, the request, the trace's own settings (``extra``) and this package's runtime modules -
so a model launched again is neither traced nor pickled.  The digest of node names and targets
travels with it: a graph that does not come back node for node is traced afresh instead.
"""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["names_digest", "pickle_trace", "unpickle_trace", "shipped"]


def names_digest(gm) -> str:
    import hashlib
    return hashlib.sha256("\n".join(f"{n.name} {n.target}" for n in gm.graph.nodes)
                          .encode()).hexdigest()


def pickle_trace(g) -> tuple:
    """``g`` for a worker: its fields pickled, its graph module by torch's graph pickler
    (which keeps every node's name and metadata; a plain pickle re-traces the module's code
    and renames its inputs), and the digest of its nodes' names and targets."""
    import copy
    import pickle

    rest = copy.copy(g)
    rest.gm = None
    return (pickle.dumps(rest, protocol=pickle.HIGHEST_PROTOCOL), _dump_graph(g.gm),
            names_digest(g.gm))


def _dump_graph(gm) -> bytes:
    """torch's :class:`GraphPickler` output for ``gm``, written by the C pickler.

    Where ``dill`` is installed torch's graph pickler is built on dill's pure-Python one, four
    times slower on a traced step; the same reductions through :class:`pickle.Pickler` give a
    stream :meth:`GraphPickler.loads` reads alike.  Should torch's pickler change shape, its
    own ``dumps`` is used."""
    import io
    import pickle

    import torch.fx._graph_pickler as gp
    options = gp.Options(ops_filter=None)
    try:
        class _CPickler(pickle.Pickler):
            _PASSTHROUGH_TYPES = gp.GraphPickler._PASSTHROUGH_TYPES
            reducer_override = gp.GraphPickler.reducer_override
            persistent_id = gp.GraphPickler.persistent_id

            def __init__(self, file):
                super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
                self.options = options
                self._unpickle_state = gp._UnpickleStateToken(object())
                self._meta_tensor_describer = gp.MetaTensorDescriber(copy_data=False)

        with gp.patch_pytree_map_over_slice(), io.BytesIO() as stream:
            _CPickler(stream).dump(gm)
            return stream.getvalue()
    except (AttributeError, TypeError, pickle.PicklingError):
        return gp.GraphPickler.dumps(gm, options)


def unpickle_trace(blob: tuple):
    """:func:`pickle_trace`'s ``g`` again, or ``None`` when its graph did not come back
    node for node (the worker then traces the step itself)."""
    import pickle
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    fields, module, names = blob
    try:
        with warnings.catch_warnings():      # torch's pytree specs warn as they are rebuilt
            warnings.simplefilter("ignore")
            g = pickle.loads(fields)
            gm = GraphPickler.loads(module, FakeTensorMode())
            gm.recompile()                   # its forward (the reference calls the module)
    except Exception:  # noqa: BLE001 - whatever did not come back is traced here instead
        return None
    if names_digest(gm) != names:
        return None
    g.gm = gm
    return g


def shipped(spec: str, batch, model_args: dict | None, extra: dict, build) -> tuple:
    """``build()`` (a :func:`pickle_trace` of the step), from the capture cache when it holds
    one for the same model code, request, ``extra`` and runtime code."""
    from explorer.engine.core import capture_cache
    return capture_cache.trace(spec, batch, model_args,
                               {**extra, "runtime": _runtime_digest()}, build)


@functools.lru_cache(maxsize=1)
def _runtime_digest() -> str:
    """The digest of the modules that make and read shipped traces (a trace pickled by other
    code is never shipped)."""
    from explorer.engine.core.capture_cache import files_digest
    here = Path(__file__).resolve().parent
    return files_digest([here / f for f in ("traces.py", "opexec.py", "compiled.py")])
