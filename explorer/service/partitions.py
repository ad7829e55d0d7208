"""Tofu plans for the app: the plan (or a Section 7.3 baseline) with its steps, the Figure 11
strip of tile owners, and every Tofu-family method side by side (Figure 10)."""

from __future__ import annotations

from explorer.engine.search.request import Request
from explorer.service.captures import opgraph_for
from explorer.service.results import result

__all__ = ["tofu", "tofu_strip", "tofu_compare"]


def tofu(req: Request, algo: str = "tofu", pins=()) -> dict:
    """Tofu (or a Section 7.3 baseline) on the request's model: the plan summary and steps,
    with the digest of the operator graph it was made on (its runs are stored under it)."""
    from explorer.engine.core.opgraph import opgraph_digest
    res = result(req, algo, tuple(pins or ()))
    doc = res.to_dict(tensors=False)
    doc["request"] = req.to_dict()
    doc["opgraph_digest"] = opgraph_digest(opgraph_for(req))
    return doc


def tofu_strip(req: Request, algo: str = "tofu", upto: int | None = None) -> list:
    """Figure 11 blocks (weight and activation tile owners) after the first ``upto`` steps."""
    from explorer.engine.tofu import search as T
    return T.strip(result(req, algo).plan, opgraph_for(req), upto=upto)


def tofu_compare(req: Request) -> dict:
    """Every Tofu-family algorithm's communication, time and memory (Figure 10)."""
    from explorer.engine.search import names
    return {algo: result(req, algo).summary() for algo in names("tofu")}
