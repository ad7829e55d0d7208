"""The vocabulary the app shows, explained where it is shown: every dimension letter and cost
symbol of OptCNN (Jia et al., ICML 2018), the equation and theorem names, the configuration
"1", and the Tofu and Celeritas terms the Learn page uses (coarsened graph, recursion step,
partition-n-reduce, CPD-TOPO, Standard Evaluation, Optimal Operation Fusion, CCR, Adjusting
Placement, Order-Place, Baechi), as hover tooltips.

:func:`term` wraps a word in an ``<abbr>`` whose tooltip is its entry; :func:`explain` turns a
text with such words ("n2 c2", "t_X", "equation 2") into a list of strings and tooltipped
terms, so any label can carry its own explanations.
"""

from __future__ import annotations

import re

from dash import html

GLOSSARY = {
    "n": "n: the sample (batch) dimension. n4 = the batch is split into 4 parts, one per "
         "group of devices (data parallelism).",
    "c": "c: the channel dimension (output channels / features). c4 = each device computes a "
         "quarter of the output channels (model parallelism).",
    "h": "h: the height of an image (spatial dimension). h2 = each device computes one half "
         "of the rows; it needs a halo of neighbouring rows from its neighbour.",
    "w": "w: the width of an image (spatial dimension). w2 = each device computes one half of "
         "the columns.",
    "l": "l: the length of a sequence (time steps / tokens). l2 = each device computes half "
         "of the positions.",
    "e": "e: the experts of a mixture-of-experts layer. e4 = each device holds a quarter of "
         "the experts and computes their tokens (expert parallelism); tokens reach it by an "
         "all-to-all.",
    "k": "k: the reduction dimension (input channels / features summed over). k2 = each "
         "device holds half of the inputs and the partial outputs are added "
         "(reduce-scatter, t_R).",
    "t_C": "t_C(l, c): compute time of layer l under configuration c - the slowest device's "
           "forward + backward time (equation 1's first sum).",
    "t_S": "t_S(l, c): parameter synchronisation time of layer l under c - exchanging weight "
           "gradients among the devices holding copies of the same weights.",
    "t_X": "t_X(e, c_i, c_j): transfer time of edge e between layers i and j - moving the "
           "tensor from the layout c_i produces to the layout c_j needs (forward and backward).",
    "t_R": "t_R(l, c): reduce-scatter time of a configuration that splits the reduction "
           "dimension k (partial sums added across devices).",
    "t_O": "t_O(G, D, S): the objective - the predicted time of one training step: the sum of "
           "every t_C, t_S (and t_R) and every edge's t_X (equation 1).",
    "equation 1": "Equation 1: t_O = Σ_layers [t_C(l, c_l) + t_S(l, c_l)] + Σ_edges "
                  "t_X(e, c_i, c_j) - the cost of a whole plan.",
    "equation 2": "Equation 2 (node elimination): a layer j with one in-edge from i and one "
                  "out-edge to k is removed; the new edge i→k costs t_X(e', c_i, c_k) = "
                  "min over c_j of [t_X(e1, c_i, c_j) + t_C(j, c_j) + t_S(j, c_j) + "
                  "t_X(e2, c_j, c_k)].",
    "equation 3": "Equation 3 (edge elimination): two edges between the same layers i and j "
                  "become one with t_X(e', c_i, c_j) = t_X(e1, c_i, c_j) + t_X(e2, c_i, c_j).",
    "Theorem 1": "Theorem 1: node and edge eliminations keep the optimum - the best plan of the "
                 "reduced graph, with each eliminated layer given the configuration that "
                 "minimised equation 2 for its neighbours' choices (undo), is the best plan "
                 "of the original graph.",
    "configuration 1": 'configuration "1": every dimension has degree 1 - the layer is not '
                       "split; it runs whole on one device.",
    "coarsened graph": "Tofu's coarsened graph: the training step's operators grouped (an "
                       "operator with its gradient, element-wise chains fused) so that the "
                       "dynamic program partitions far fewer nodes, each group tiled alike.",
    "CPD-TOPO": "CPD-TOPO (Celeritas): a topological order that visits the critical path "
                "first - each operator's longest path to the end decides which ready operator "
                "comes next - so a chain stays together and few edges are cut between devices.",
    "Standard Evaluation": "Standard Evaluation (Celeritas): every operator's compute time, "
                           "memory and output size estimated once, with the same rules for "
                           "every placer, so their placements are judged alike.",
    "Adjusting Placement": "Adjusting Placement (Celeritas): the fused clusters are assigned "
                           "in CPD-TOPO order, each to the device where it finishes earliest "
                           "within its memory; a cluster that does not fit moves on.",
    "Optimal Operation Fusion": "Optimal Operation Fusion (Celeritas, Algorithm 1): "
                                "operators consecutive in the CPD-TOPO order are merged into "
                                "clusters by a dynamic program over breakpoints (at most R "
                                "operators and M bytes per cluster) that leaves the least "
                                "communication between clusters; the clusters form an "
                                "acyclic coarse graph.",
    "CCR": "CCR (communication-to-computation ratio): the mean time to send an operator's "
           "output to another device over its mean compute time. A high CCR (thousands of "
           "small operators) misleads list schedulers; fusion lowers it.",
    "Order-Place": "Order-Place (Celeritas): the fused clusters placed in CPD-TOPO order on "
                   "one device until its memory is full, then on the next - Adjusting "
                   "Placement without its moves.",
    "partition-n-reduce": "partition-n-reduce (Tofu): an operator's way to run on several "
                          "workers - split an output coordinate (each worker computes a "
                          "slice) or a summed variable (each worker computes a partial "
                          "output, then the partials are added).",
    "recursion step": "A recursion step (Tofu, Section 5.2): every worker group of the "
                      "previous step is cut in k_i (2 for a power of two); one choice - an "
                      "axis per tensor, a strategy per operator - is applied to every group "
                      "and costs the bytes the groups then exchange. m steps give 2^m "
                      "workers; the plan's bytes are the steps' sum.",
    "Baechi": "Baechi (Jeon et al., SoCC 2020): the device placers m-TOPO, m-ETF and m-SCT "
              "(memory-constrained topological, earliest-task-first and small-"
              "communication-time placement) that Celeritas compares against.",
}

#: a configuration label's parts, e.g. "n4", "c2", "k8"
_DEGREE = re.compile(r"\b([nchwlek])(\d+)\b")
_CONFIG_1 = re.compile(r"c_[ijk]\*? ?= ?1\b")
_TERMS = re.compile(r"(t_[CSXRO]\b|[Ee]quation [123]\b|eq\. [123]\b|Theorem 1\b|"
                    r"\b[nchwlek]\d+\b|coarsened graph|CPD-TOPO|Standard Evaluation|"
                    r"Adjusting Placement|Baechi|Optimal Operation Fusion|\bCCR\b|"
                    r"Order-Place|partition-n-reduce|recursion steps?\b|"
                    r"c_[ijk]\*? ?= ?1\b)")


def key_of(word: str) -> str | None:
    """The glossary entry of ``word`` (``"n4"`` -> ``"n"``, ``"eq. 2"`` -> ``"equation 2"``)."""
    m = _DEGREE.fullmatch(word)
    if m:
        return m.group(1)
    if _CONFIG_1.fullmatch(word):          # "c_j = 1": the configuration named "1"
        return "configuration 1"
    if word == "recursion steps":
        return "recursion step"
    w = word.replace("eq.", "equation").replace("Equation", "equation")
    return w if w in GLOSSARY else None


def term(text: str, key: str | None = None, **kw):
    """``text`` with ``key``'s (or its own) glossary entry as its tooltip."""
    entry = GLOSSARY.get(key or key_of(text) or text)
    if entry is None:
        return text
    return html.Abbr(text, title=entry, className="term", **kw)


def explain(text: str) -> list:
    """``text`` as strings and :func:`term` pieces: every letter, symbol, equation and theorem
    named in it carries its tooltip."""
    out = []
    pos = 0
    for m in _TERMS.finditer(text):
        if m.start() > pos:
            out.append(text[pos:m.start()])
        out.append(term(m.group(0)))
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def header_tips(symbols: dict) -> dict:
    """AG Grid header tooltips: ``{field: glossary entry}`` for ``{field: key}``."""
    return {f: GLOSSARY[k] for f, k in symbols.items() if k in GLOSSARY}


__all__ = ["GLOSSARY", "key_of", "term", "explain", "header_tips"]
