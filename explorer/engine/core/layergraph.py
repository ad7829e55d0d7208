"""The layer graph: the computation graph OptCNN searches over.

A :class:`LayerGraph` wraps a ``networkx.MultiDiGraph`` whose nodes are layer names with a
``layer`` attribute (:class:`Layer`) and whose edges carry an ``edge`` attribute
(:class:`Edge`).  Parallel edges are kept (a layer may read the same tensor twice), because the
paper's edge elimination merges exactly those.

Each layer names the *axes* of its output tensor with the paper's dimension letters
(``n`` sample, ``c`` channel, ``h`` height, ``w`` width, ``l`` length, ``e`` the experts of
a mixture-of-experts layer); an axis that cannot be
partitioned is ``"-"``.  Those letters are what configurations are keyed by.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field

import networkx as nx

from explorer.engine.core.plandoc import dumps

DIM_LETTERS = ("n", "c", "h", "w", "l", "e")


@dataclass
class Layer:
    """One layer of the model (an fx node with its folded element-wise followers).

    Attributes
    ----------
    name: unique node name (the fx node name of the producing op).
    op: op kind understood by :mod:`explorer.engine.core.geometry` (``conv2d``, ``linear`` ...).
    out_shape: shape of the layer's output tensor.
    axes: one dimension letter per output axis (``"-"`` = not partitionable).
    in_shapes: shapes of the op's tensor inputs, in argument order, as the op sees them.
    params: parameter name -> shape (weights owned by this layer, folded BatchNorm included).
    attrs: op attributes (kernel, stride, padding, groups, concat dim, ...).
    flops: forward FLOPs of the whole layer (backward is counted as 2x forward).
    module: dotted path of the owning ``nn.Module`` (for hierarchy in views).
    folded: names of fx nodes folded into this layer (activations, BatchNorm, dropout).
    qualnames: ``params`` key -> qualified name of the model parameter behind it (buffers
        left out; ``None`` when unknown, e.g. a hand-built graph): what makes
        :attr:`LayerGraph.parameters` count a weight used by several layers (an unrolled
        RNN cell, tied embeddings) once.

    An ``op == "param"`` layer has no inputs: its output is a parameter or buffer
    (``attrs["tensor"]``) broadcast to ``out_shape`` - a class token, position ids - so a
    tensor read as an activation still has a producer that owns it.
    """

    name: str
    op: str
    out_shape: tuple
    axes: tuple
    in_shapes: tuple = ()
    params: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    flops: float = 0.0
    module: str = ""
    folded: list = field(default_factory=list)
    dtype_bytes: int = 4
    qualnames: dict | None = None

    def __post_init__(self):
        self.out_shape = tuple(int(s) for s in self.out_shape)
        self.axes = tuple(self.axes)
        if len(self.axes) != len(self.out_shape):
            raise ValueError(
                f"layer {self.name}: {len(self.axes)} axis letters {self.axes} for a "
                f"rank-{len(self.out_shape)} output {self.out_shape}")
        bad = [a for a in self.axes if a != "-" and a not in DIM_LETTERS]
        if bad:
            raise ValueError(f"layer {self.name}: unknown dimension letters {bad}")
        letters = [a for a in self.axes if a != "-"]
        if len(set(letters)) != len(letters):
            raise ValueError(f"layer {self.name}: repeated dimension letters {self.axes}")

    @property
    def dims(self) -> tuple:
        """Parallelizable dimension letters in axis order (paper Table 1)."""
        return tuple(a for a in self.axes if a != "-")

    def axis_of(self, letter: str) -> int:
        return self.axes.index(letter)

    def size(self, letter: str) -> int:
        return self.out_shape[self.axis_of(letter)]

    @property
    def out_bytes(self) -> int:
        return math.prod(self.out_shape) * self.dtype_bytes

    @property
    def param_count(self) -> int:
        return sum(math.prod(s) for s in self.params.values())

    def to_dict(self) -> dict:
        return {
            "name": self.name, "op": self.op, "out_shape": list(self.out_shape),
            "axes": "".join(self.axes), "in_shapes": [list(s) for s in self.in_shapes],
            "params": {k: list(v) for k, v in self.params.items()},
            "attrs": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.attrs.items()},
            "flops": self.flops, "module": self.module, "folded": list(self.folded),
        }


@dataclass
class Edge:
    """A tensor flowing from ``src``'s output into input ``index`` of ``dst``.

    ``transforms`` are view ops folded onto the edge (flatten, view, transpose, select, tuple
    item), listed from the consumer side back to the producer; geometry applies them to map a
    region the consumer needs back onto the producer's output tensor.
    """

    src: str
    dst: str
    index: int
    transforms: tuple = ()

    def to_dict(self) -> dict:
        return {"src": self.src, "dst": self.dst, "index": self.index,
                "transforms": [list(t) if isinstance(t, tuple) else t for t in self.transforms]}


class LayerGraph:
    """A model's layer graph plus what was imported with it.

    Example
    -------
    >>> g = LayerGraph("toy", batch=8)
    >>> g.add_layer(Layer("x", "input", (8, 4), ("n", "c")))
    >>> g.add_layer(Layer("fc", "linear", (8, 2), ("n", "c"), in_shapes=((8, 4),),
    ...                   params={"weight": (2, 4)}))
    >>> g.add_edge(Edge("x", "fc", 0))
    >>> [l.name for l in g.layers()]
    ['x', 'fc']
    """

    def __init__(self, model: str, batch: int, source: str = ""):
        self.model = model
        self.batch = int(batch)
        self.source = source  # "fx" or "export"
        self.spec = model      # what to pass to load_model to rebuild it
        self.model_args: dict = {}
        self.outputs: list = []  # layers whose outputs the model returns
        #: parameters that do not affect the output (unused, or dead code): name -> elements
        self.unused_parameters: dict = {}
        self.g = nx.MultiDiGraph()
        self._order: list | None = None

    # -- construction ----------------------------------------------------------------------
    def add_layer(self, layer: Layer) -> None:
        if layer.name in self.g:
            raise ValueError(f"duplicate layer name {layer.name!r}")
        self.g.add_node(layer.name, layer=layer)
        self._order = None

    def add_edge(self, edge: Edge) -> None:
        for end in (edge.src, edge.dst):
            if end not in self.g:
                raise ValueError(f"edge {edge.src}->{edge.dst}: unknown layer {end!r}")
        self.g.add_edge(edge.src, edge.dst, edge=edge)
        self._order = None

    # -- queries ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.g.number_of_nodes()

    def __contains__(self, name) -> bool:
        return name in self.g

    def layer(self, name: str) -> Layer:
        try:
            return self.g.nodes[name]["layer"]
        except KeyError:
            raise KeyError(f"no layer named {name!r}") from None

    def names(self) -> list:
        """Layer names in a deterministic topological order."""
        if self._order is None:
            self._order = list(nx.lexicographical_topological_sort(
                self.g, key=lambda n: self._insertion_rank(n)))
        return list(self._order)

    def _insertion_rank(self, name):
        if not hasattr(self, "_rank") or len(self._rank) != len(self.g):
            self._rank = {n: i for i, n in enumerate(self.g.nodes)}
        return self._rank[name]

    def layers(self) -> list:
        return [self.layer(n) for n in self.names()]

    def edges(self) -> list:
        """All edges (parallel ones separately) in topological order of their destination."""
        order = {n: i for i, n in enumerate(self.names())}
        es = [d["edge"] for _, _, d in self.g.edges(data=True)]
        es.sort(key=lambda e: (order[e.dst], e.index, order[e.src]))
        return es

    def in_edges(self, name: str) -> list:
        return sorted((d["edge"] for _, _, d in self.g.in_edges(name, data=True)),
                      key=lambda e: e.index)

    def out_edges(self, name: str) -> list:
        return [d["edge"] for _, _, d in self.g.out_edges(name, data=True)]

    @property
    def parameters(self) -> int:
        """Parameter count of the graph, each model parameter once (by
        :attr:`Layer.qualnames`; layers without them count their ``params``)."""
        unique: dict = {}
        other = 0
        for la in self.layers():
            if la.qualnames is None:
                other += la.param_count
                continue
            for k, q in la.qualnames.items():
                unique[q] = math.prod(la.params[k])
        return other + sum(unique.values())

    def summary(self) -> dict:
        ls = self.layers()
        ops = dict(Counter(lay.op for lay in ls))
        return {
            "model": self.model, "batch": self.batch, "layers": len(ls),
            "edges": self.g.number_of_edges(), "ops": ops,
            "parameters": self.parameters,
            "flops_forward": sum(l.flops for l in ls),
            "activation_bytes": sum(l.out_bytes for l in ls),
        }

    def to_dict(self) -> dict:
        return {"model": self.model, "batch": self.batch, "source": self.source,
                "layers": [l.to_dict() for l in self.layers()],
                "edges": [e.to_dict() for e in self.edges()]}


def graph_digest(graph) -> str:
    """Hash of what a plan depends on in a layer graph: every layer's name, op, output shape,
    axes, input shapes and parameter shapes, and every edge (16 hex digits)."""
    doc = {"layers": [[la.name, la.op, list(la.out_shape), list(la.axes),
                       [list(s) for s in la.in_shapes],
                       sorted([k, list(v)] for k, v in la.params.items())]
                      for la in graph.layers()],
           "edges": [[e.src, e.dst, e.index] for e in graph.edges()]}
    return hashlib.sha256(dumps(doc, separators=(",", ":"))
                          .encode()).hexdigest()[:16]
