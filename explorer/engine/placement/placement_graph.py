"""The graph every placer sees: operators with estimated time and memory, tensors on edges.

:class:`PlacementGraph` is the single input of Celeritas, its baselines and the simulator, so
all methods are judged on exactly the same numbers (and ``--dump-graph`` writes exactly this).

Model
-----
* Node ``v`` is an operator (or a parameter / buffer / input tensor, which TensorFlow graphs
  also have as ``Variable`` nodes).  ``w[v, d]`` is its compute time on device ``d``;
  ``mem[v]`` the bytes it adds to the device it is placed on (its output, 0 for views; a
  parameter node's bytes are the parameter); ``out_bytes[v]`` the size of its output, i.e.
  what an edge ``(v, u)`` carries when ``u`` is on another device.
* A tensor is sent once per receiving device, however many operators there read it.
* Communication time ``t = k·d + b`` with ``k = 1 / bandwidth`` and ``b = latency`` of the
  link (Section 4.2.1).  Priorities (tlevel/blevel, CCR, fusion) use the mean link:
  ``c(v, u) = k̄·out_bytes[v] + b̄``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["PlacementGraph", "from_networkx"]


@dataclass
class PlacementGraph:
    """Operators, tensors and the device graph they are placed on.

    Parameters
    ----------
    names : list of str
        Operator names, index = node id.
    w : ndarray, shape (n, D)
        Compute time (s) of each node on each device.
    mem : ndarray, shape (n,)
        Bytes a node adds to its device's memory (Standard Evaluation).
    out_bytes : ndarray, shape (n,)
        Bytes of the node's output tensor (what an out-edge transfers).
    src, dst : ndarray of int
        Edges: ``src[e]``'s output is read by ``dst[e]``.
    devices : DeviceGraph
        Devices (capacity, links).
    capacity : ndarray, shape (D,), optional
        Memory limit per device (bytes); defaults to each device's memory.
    persistent : ndarray of bool, optional
        Outputs that stay resident for the whole step (parameters, updated parameters).
    alias : ndarray of int, optional
        For view operators, the node whose storage the output shares (else -1).
    info : dict
        Per-node extras for views and dumps (``target``, ``phase``, ...), lists of length n.
    group : ndarray of int, optional
        Co-location group per node (-1: none).  As in TensorFlow and Baechi (Celeritas
        Section 6.1), the group's first node in the placer's order decides the device of the
        whole group: backward operators follow their forward operator, an update its parameter.
    """

    names: list
    w: np.ndarray
    mem: np.ndarray
    out_bytes: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    devices: object
    capacity: np.ndarray | None = None
    persistent: np.ndarray | None = None
    alias: np.ndarray | None = None
    info: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    group: np.ndarray | None = None

    def __post_init__(self):
        n, nd = len(self.names), self.devices.n
        self.w = np.asarray(self.w, dtype=np.float64)
        if self.w.ndim == 1:
            self.w = np.repeat(self.w[:, None], nd, axis=1)
        self.mem = np.asarray(self.mem, dtype=np.float64)
        self.out_bytes = np.asarray(self.out_bytes, dtype=np.float64)
        self.src = np.asarray(self.src, dtype=np.int64)
        self.dst = np.asarray(self.dst, dtype=np.int64)
        if self.w.shape != (n, nd):
            raise ValueError(f"w has shape {self.w.shape}, expected ({n}, {nd}) for {n} nodes "
                             f"on {nd} devices")
        for nm in ("mem", "out_bytes"):
            a = getattr(self, nm)
            if a.shape != (n,):
                raise ValueError(f"{nm} has shape {a.shape}, expected ({n},)")
            if n and a.min() < 0:
                raise ValueError(f"{nm} has a negative entry {a.min()} at node "
                                 f"{self.names[int(a.argmin())]!r}")
        if n and (self.w.min() < 0 or not np.isfinite(self.w).all()):
            raise ValueError(f"compute times must be finite and >= 0 (min {self.w.min()})")
        if self.src.shape != self.dst.shape:
            raise ValueError(f"{len(self.src)} edge sources but {len(self.dst)} destinations")
        if len(self.src) and (self.src.min() < 0 or max(self.src.max(), self.dst.max()) >= n):
            raise ValueError(f"edge endpoints must lie in [0, {n}); got "
                             f"[{min(self.src.min(), self.dst.min())}, "
                             f"{max(self.src.max(), self.dst.max())}]")
        if np.any(self.src == self.dst):
            raise ValueError(f"{int(np.sum(self.src == self.dst))} self-loop edge(s)")
        # one edge per (src, dst) pair
        if len(self.src):
            key = self.src * n + self.dst
            _, keep = np.unique(key, return_index=True)
            keep.sort()
            self.src, self.dst = self.src[keep], self.dst[keep]
        cap = (np.array([d.memory for d in self.devices.devices], dtype=np.float64)
               if self.capacity is None else np.asarray(self.capacity, dtype=np.float64))
        if cap.ndim == 0:
            cap = np.full(nd, float(cap))
        if cap.shape != (nd,) or (cap <= 0).any():
            raise ValueError(f"capacity must be {nd} positive numbers, got {cap.tolist()}")
        self.capacity = cap
        self.persistent = (np.zeros(n, dtype=bool) if self.persistent is None
                           else np.asarray(self.persistent, dtype=bool))
        self.alias = (np.full(n, -1, dtype=np.int64) if self.alias is None
                      else np.asarray(self.alias, dtype=np.int64))
        self.group = (np.full(n, -1, dtype=np.int64) if self.group is None
                      else np.asarray(self.group, dtype=np.int64))
        if self.persistent.shape != (n,) or self.alias.shape != (n,) or \
                self.group.shape != (n,):
            raise ValueError(f"persistent/alias/group must have length {n}")
        self._build_adjacency()
        self.topo = self._topological()       # raises ValueError on a cycle
        bw, lat = self.devices.bw, self.devices.latency
        p2p = (getattr(self.devices, "meta", None) or {}).get("p2p")
        #: what sending ``x`` bytes takes the sender's own thread: ``send_b + send_k·x``
        #: (calibrated isend calls of local workers; 0 where a copy engine sends)
        self.send_b = self.send_k = 0.0
        if p2p:          # calibrated point-to-point send/recv (local workers), see devices
            bw, lat = np.full((nd, nd), float(p2p["bw"])), np.full((nd, nd), float(p2p["latency"]))
            self.send_b = float(p2p.get("send_s", 0.0))
            self.send_k = 1.0 / float(p2p["send_bw"]) if p2p.get("send_bw") else 0.0
        off = ~np.eye(nd, dtype=bool)
        #: per-pair k = 1/bandwidth (0 on the diagonal) and b = latency
        self.k = np.where(off, 1.0 / np.where(off, bw, 1.0), 0.0)
        self.b = np.where(off, lat, 0.0)
        self.k_mean = float(self.k[off].mean()) if nd > 1 else float(
            1.0 / 16e9)  # one device: a nominal PCIe link for priorities only
        self.b_mean = float(self.b[off].mean()) if nd > 1 else 10e-6

    # -- structure ----------------------------------------------------------------------------
    def _build_adjacency(self):
        n = len(self.names)
        succ: list = [[] for _ in range(n)]
        pred: list = [[] for _ in range(n)]
        for s, d in zip(self.src.tolist(), self.dst.tolist()):
            succ[s].append(d)
            pred[d].append(s)
        self.succ, self.pred = succ, pred

    def _topological(self) -> np.ndarray:
        n = len(self.names)
        indeg = np.bincount(self.dst, minlength=n).astype(np.int64)
        stack = [v for v in range(n - 1, -1, -1) if indeg[v] == 0]
        order = []
        indeg = indeg.tolist()
        while stack:
            v = stack.pop()
            order.append(v)
            for u in self.succ[v]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    stack.append(u)
        if len(order) != n:
            raise ValueError(f"the graph has a cycle: {n - len(order)} of {n} nodes are on or "
                             f"behind one")
        return np.asarray(order, dtype=np.int64)

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def n_edges(self) -> int:
        return len(self.src)

    @property
    def ndev(self) -> int:
        return self.devices.n

    def index(self) -> dict:
        """Name -> node id."""
        if "_index" not in self.meta:
            self.meta["_index"] = {nm: i for i, nm in enumerate(self.names)}
        return self.meta["_index"]

    # -- costs ----------------------------------------------------------------------------------
    def w_ref(self) -> np.ndarray:
        """Compute time per node used for priorities: the mean over devices."""
        return self.w.mean(axis=1)

    def edge_comm(self) -> np.ndarray:
        """``c_{i,j} = k̄·d + b̄`` per edge (mean link), the paper's c in equations 1-9."""
        return self.k_mean * self.out_bytes[self.src] + self.b_mean

    def comm(self, nbytes, a: int, b: int):
        """Transfer time of ``nbytes`` from device ``a`` to ``b`` (0 on the same device)."""
        return self.k[a, b] * nbytes + self.b[a, b]

    def ccr(self) -> float:
        """Communication-to-computing ratio, equation 1."""
        wsum = float(self.w_ref().sum())
        return float(self.edge_comm().sum()) / wsum if wsum > 0 else float("inf")

    def total_memory(self) -> float:
        return float(self.mem.sum())

    def with_capacity(self, capacity) -> "PlacementGraph":
        """A copy with another per-device memory limit (bytes, scalar or per device)."""
        return PlacementGraph(self.names, self.w, self.mem, self.out_bytes, self.src, self.dst,
                              self.devices, capacity, self.persistent, self.alias, self.info,
                              {k: v for k, v in self.meta.items() if not k.startswith("_")},
                              self.group)

    def without_groups(self) -> "PlacementGraph":
        """A copy with no co-location groups."""
        g = self.with_capacity(self.capacity)
        g.group = np.full(self.n, -1, dtype=np.int64)
        return g

    # -- export ---------------------------------------------------------------------------------
    def to_node_link(self) -> dict:
        """Node-link JSON (networkx layout) with each operator's estimated time and memory,
        each edge's bytes and the device graph - ``--dump-graph``'s format."""
        nodes = []
        for i, nm in enumerate(self.names):
            d = {"id": nm, "time_s": float(self.w[i, 0]), "time_s_per_device": self.w[i].tolist(),
                 "memory_bytes": float(self.mem[i]), "out_bytes": float(self.out_bytes[i]),
                 "persistent": bool(self.persistent[i]), "group": int(self.group[i])}
            for key, vals in self.info.items():
                d[key] = vals[i]
            nodes.append(d)
        links = [{"source": self.names[s], "target": self.names[t],
                  "bytes": float(self.out_bytes[s]),
                  "comm_s": float(self.k_mean * self.out_bytes[s] + self.b_mean)}
                 for s, t in zip(self.src.tolist(), self.dst.tolist())]
        dev = self.devices.to_dict()
        dev["capacity_bytes"] = self.capacity.tolist()
        return {"directed": True, "multigraph": False,
                "graph": {"model": self.meta.get("model"), "batch": self.meta.get("batch"),
                          "devices": dev,
                          "comm_model": "t = k*bytes + b; k = 1/bandwidth, b = latency"},
                "nodes": nodes, "links": links}


def from_networkx(g, devices, time_attr: str = "time", mem_attr: str = "mem",
                  bytes_attr: str = "out_bytes", capacity=None) -> PlacementGraph:
    """Build a :class:`PlacementGraph` from a networkx DiGraph (tests, external graphs).

    Node attributes ``time`` (s, scalar or per device), ``mem`` and ``out_bytes`` (bytes);
    missing ones default to 0.  An edge's size is its source's ``out_bytes`` (or the edge's
    ``bytes`` attribute when every out-edge of the source has the same one).
    """
    names = list(g.nodes)
    idx = {v: i for i, v in enumerate(names)}
    nd = devices.n
    w = np.zeros((len(names), nd))
    mem = np.zeros(len(names))
    ob = np.zeros(len(names))
    for v, a in g.nodes(data=True):
        i = idx[v]
        w[i] = a.get(time_attr, 0.0)
        mem[i] = a.get(mem_attr, 0.0)
        ob[i] = a.get(bytes_attr, 0.0)
    for u in names:
        bs = {a.get("bytes") for _, _, a in g.out_edges(u, data=True)}
        if ob[idx[u]] == 0 and len(bs) == 1 and None not in bs:
            ob[idx[u]] = bs.pop()
    src = np.array([idx[u] for u, _ in g.edges], dtype=np.int64)
    dst = np.array([idx[v] for _, v in g.edges], dtype=np.int64)
    return PlacementGraph([str(v) for v in names], w, mem, ob, src, dst, devices, capacity)
