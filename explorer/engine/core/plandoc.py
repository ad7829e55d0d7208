"""Plan documents: every saved plan names its ``schema`` (the plan kind) and ``version``.

Three kinds of plan exist, one per method family, and each document holds everything needed
to execute it:

==========================  ============================================================
schema                      body
==========================  ============================================================
``plan-explorer/layerwise`` a configuration and device list per layer (OptCNN family)
``plan-explorer/tofu``      every tensor's box per worker, every operator's output box,
                            input regions and reduction (Tofu family)
``plan-explorer/placement`` a device per operator (Celeritas family)
==========================  ============================================================

:func:`seal` stamps a document before it is written to a file (schema, version and a
``checksum`` over everything else); :func:`open_document` checks one that was read back and
returns its kind.  Documents written by version 1 (``plan-explorer/plan@1``,
``plan-explorer/placement@1``, ``plan-explorer/tofu-plan@1``) carry no checksum; they are
accepted where they still hold what execution needs.

Example::

    >>> doc = seal({"model": "mlp", "layers": []}, "layerwise")
    >>> doc["schema"], doc["version"], open_document(doc)
    ('plan-explorer/layerwise', 2, 'layerwise')
    >>> doc["model"] = "lenet5"
    >>> open_document(doc)
    Traceback (most recent call last):
    ...
    explorer.errors.PlanFileError: the plan was edited after it was saved (its checksum does not match): save it again with `explorer search --out` or from the app
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from explorer.errors import PlanFileError

__all__ = ["KINDS", "VERSION", "schema_of", "seal", "open_document", "checksum", "kind_of",
           "to_jsonable", "dumps"]

KINDS = ("layerwise", "tofu", "placement")
VERSION = 2
_PREFIX = "plan-explorer/"
#: version-1 schema strings -> kind
_LEGACY = {"plan-explorer/plan@1": "layerwise", "plan-explorer/placement@1": "placement",
           "plan-explorer/tofu-plan@1": "tofu"}


def schema_of(kind: str) -> str:
    """``"tofu"`` -> ``"plan-explorer/tofu"``."""
    if kind not in KINDS:
        raise ValueError(f"unknown plan kind {kind!r}: one of {', '.join(KINDS)}")
    return _PREFIX + kind


def to_jsonable(o):
    """``json.dumps`` ``default=``: numpy scalars and arrays, tuples and sets as lists."""
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (tuple, set, frozenset)):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def dumps(obj, **kw) -> str:
    """``json.dumps`` with :func:`to_jsonable` (the project's one JSON encoder)."""
    return json.dumps(obj, default=to_jsonable, **kw)


def checksum(doc: dict) -> str:
    """SHA-256 (16 hex digits) of the canonical JSON of ``doc`` without its ``checksum``."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=to_jsonable)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def seal(doc: dict, kind: str) -> dict:
    """A copy of ``doc`` as plain JSON types with ``schema``, ``version`` and ``checksum``."""
    out = json.loads(dumps(doc))
    out["schema"] = schema_of(kind)
    out["version"] = VERSION
    out["checksum"] = checksum(out)
    return out


def kind_of(doc) -> str | None:
    """The plan kind a document claims (``None``: not a plan document)."""
    if not isinstance(doc, dict):
        return None
    schema = str(doc.get("schema", ""))
    if schema in _LEGACY:
        return _LEGACY[schema]
    if schema.startswith(_PREFIX) and schema[len(_PREFIX):] in KINDS:
        return schema[len(_PREFIX):]
    return None


def open_document(doc, verify: bool = True) -> str:
    """Check a plan document read back from a file or upload; its kind.

    Raises :class:`~explorer.errors.PlanFileError` for a document that is not a plan, names
    an unknown schema, comes from a newer version, or (``verify``) was edited after it was
    sealed."""
    if not isinstance(doc, dict):
        raise PlanFileError("not a plan: expected a JSON object written by `explorer search "
                            "--out` or the app's download")
    kind = kind_of(doc)
    if kind is None:
        raise PlanFileError(f"unknown plan schema {doc.get('schema')!r}: Plan Explorer reads "
                            f"{', '.join(schema_of(k) for k in KINDS)}")
    if str(doc.get("schema")) in _LEGACY:
        return kind
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise PlanFileError(f"plan version {version!r} is not a version number")
    if version > VERSION:
        raise PlanFileError(f"the plan was written by a newer Plan Explorer (version {version}; "
                            f"this one reads up to {VERSION}): upgrade to use it")
    if verify and "checksum" in doc and doc["checksum"] != checksum(doc):
        raise PlanFileError("the plan was edited after it was saved (its checksum does not "
                            "match): save it again with `explorer search --out` or from the app")
    if verify and "checksum" not in doc:
        raise PlanFileError("the plan has no checksum: save it with `explorer search --out` "
                            "or from the app")
    return kind
