"""Learn scenarios from OptCNN (Jia, Lin, Qi, Aiken: "Exploring Hidden Dimensions in
Parallelizing Convolutional Neural Networks", ICML 2018): Figures 1-4, the §3 fully-connected
example, Figures 5-6 (equations 2 and 3) and Figures 7-8 with Table 5."""

from __future__ import annotations

import dash
from dash import Input, Output, dcc, html

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import glossary as G
from explorer.views import ids
from explorer.views.figures import compare as CF
from explorer.views.figures import learn as LF
from explorer.views.figures.compare import message_figure
from explorer.views.learn import paper
from explorer.views.learn.common import (
    choice,
    control,
    explorer_href,
    fmt_bytes,
    fmt_time,
    frame,
    graph,
    number,
    table,
)

SCENARIOS = {"dims": "OptCNN Fig. 1–4: hidden dimensions",
             "dense": "OptCNN §3: one dense layer",
             "elim": "OptCNN Fig. 5–6: eliminations",
             "scale": "OptCNN Fig. 7–8, Table 5"}
PRESET = "p100-nvlink-4"
#: the bandwidth control: device presets of the papers' machines
BANDWIDTHS = [{"label": "4×P100 NVLink (40 GB/s)", "value": "p100-nvlink-4"},
              {"label": "4×V100 PCIe (16 GB/s)", "value": "v100-pcie-4"},
              {"label": "P100 nodes over InfiniBand (12.5 GB/s between)",
               "value": "p100-cluster"}]
ELIM_MODELS = {"inception_v3": ("Inception-v3 (75×75 input)", {"image_size": "75"}, 8),
               "resnet50": ("ResNet-50 (32×32 input)", {"image_size": "32"}, 8),
               "lenet5": ("LeNet-5", {}, 64)}
SCALE_MODELS = {"vgg16": "VGG-16", "alexnet": "AlexNet", "inception_v3": "Inception-v3"}
K = "optcnn-"


def _req(model, devices, batch=None, args=None, preset=PRESET, algo="optcnn"):
    return session.Request(model=model, devices=int(devices), batch=batch, preset=preset,
                           model_args=dict(args or {}), algo=algo)


# -- Figures 1-4 -------------------------------------------------------------------------------

def _dims_layout():
    key = K + "dims"
    return frame(key, "Hidden dimensions of one layer (Figures 1–4, Table 1)", [
        "A convolution's output has four parallelizable dimensions: sample n, channel c, "
        "height h and width w (Table 1). A configuration gives each a degree; the product is "
        "the number of devices, and every configuration computes the same output.",
        "Pick a VGG-16 convolution and a configuration: the bars show its time under every "
        "configuration (t_C compute + t_S parameter synchronisation, our cost model on the "
        "chosen devices and links), the rectangles which part of the output each device computes, and the last "
        "chart what each device must read: its input region (halos included), the part of it "
        "to fetch from other devices when the layer before is data-parallel, and its "
        "parameters.",
    ], [
        control("layer", choice(key, "layer", [], None)),
        control("devices", choice(key, "devices", [2, 4], 4)),
        control("batch", number(key, "batch", 32, 1, 512)),
        control("bandwidth", choice(key, "preset", BANDWIDTHS, PRESET)),
        control("configuration", choice(key, "config", [], None)),
    ], [graph(key, "times"), graph(key), graph(key, "reads")], [
        html.P(paper.OPTCNN["fig1"]),
        html.H4("Table 1: parallelizable dimensions"),
        table(("layer", "dimensions"), paper.OPTCNN["table1"]),
    ])


def _parse(degrees: str) -> dict:
    return {k: int(v) for k, v in (p.split("=") for p in degrees.split(",") if p)}


def dims_options(devices, batch, layer, preset=PRESET):
    """Layer options (VGG-16's convolutions), the layer shown (default Conv8, the paper's
    Figure 1 layer), its configuration options on all ``devices``, the fastest one, and the
    candidate rows they come from."""
    req = _req("vgg16", devices, batch, preset=preset)
    g = session.graph_for(req)
    convs = [n for n in g.names() if g.layer(n).op == "conv"]
    layers = [{"label": f"Conv{i + 1} ({n})", "value": n} for i, n in enumerate(convs)]
    if layer not in convs:
        layer = convs[7] if len(convs) > 7 else convs[0]
    full = ",".join(map(str, range(int(devices))))
    rows = [r for r in session.candidates(req, layer) if r["devices"] == full]
    best = min(rows, key=lambda r: r["t_compute_ms"] + r["t_sync_ms"])
    return layers, layer, [{"label": r["config"], "value": r["degrees"]} for r in rows], \
        best["degrees"], rows


def dims_figures(devices, batch, layer, degrees, rows=None, preset=PRESET):
    """The three figures, our numbers and the explorer link for one layer and configuration
    (``rows``: the layer's candidate rows on all devices when the caller has them)."""
    req = _req("vgg16", devices, batch, preset=preset)
    full = list(range(int(devices)))
    if rows is None:
        rows = [r for r in session.candidates(req, layer)
                if r["devices"] == ",".join(map(str, full))]
    cfg = _parse(degrees)
    sel = next(r for r in rows if r["degrees"] == degrees)
    tiles = session.tiles(req, layer, cfg, full)
    data = next((r for r in rows if _parse(r["degrees"]).get("n", 1) == len(full)
                 and all(v == 1 for k, v in _parse(r["degrees"]).items() if k != "n")), None)
    best = min(rows, key=lambda r: r["t_compute_ms"] + r["t_sync_ms"])
    tot = sel["t_compute_ms"] + sel["t_sync_ms"]
    ours = [table(("", "ours"), [
        ("layer", f"{layer} {tuple(tiles['shape'])} ({', '.join(tiles['axes'])})"),
        ("this configuration", f"{sel['config']}: {tot:.3f} ms (t_C {sel['t_compute_ms']:.3f}"
                               f" + t_S {sel['t_sync_ms']:.3f})"),
        ("data parallelism", (f"{data['config']}: "
                              f"{data['t_compute_ms'] + data['t_sync_ms']:.3f} ms")
         if data else "–"),
        ("fastest configuration", f"{best['config']}: "
                                  f"{best['t_compute_ms'] + best['t_sync_ms']:.3f} ms"),
    ])]
    pin = f"{layer}={degrees}@{','.join(map(str, full))}"
    href = explorer_href("vgg16", devices, preset, "optcnn", batch, pins=[pin])
    return (LF.config_times_figure(rows, sel["config"]), LF.tile_map_figure(tiles),
            LF.device_reads_figure(tiles), ours, href)


# -- §3, Figure 2 ------------------------------------------------------------------------------

def _dense_layout():
    key = K + "dense"
    return frame(key, "Data against model parallelism on one dense layer (§3, Figure 2)", [
        "VGG-16's first fully-connected layer holds 103 M parameters. In data parallelism "
        "(n = devices) every device keeps a whole copy and synchronises the gradients of all "
        "of them each step; in channel (model) parallelism (c = devices) each device owns a "
        "slice of the output channels and trains disjoint parameters - nothing to synchronise "
        "- but must receive the whole input tensor from the data-parallel layer before it.",
        "The bars are the bytes our cost model counts for each (parameter synchronisation: "
        "gradients up and parameters back; transfer: the input regions each device lacks).",
    ], [
        control("devices", choice(key, "devices", [2, 4], 2)),
        control("batch", number(key, "batch", 128, 1, 1024)),
        control("bandwidth", choice(key, "preset", BANDWIDTHS, PRESET)),
    ], [graph(key)], [html.P(paper.OPTCNN["fig2"])])


def dense_figures(devices, batch, preset):
    req = _req("vgg16", devices, batch, preset=preset)
    doc = session.learn_dense(req)
    d, c = doc["strategies"]
    ours = [table(("", d["strategy"], c["strategy"]), [
        ("configuration", d["config"], c["config"]),
        ("t_C compute", fmt_time(d["t_compute_s"]), fmt_time(c["t_compute_s"])),
        ("t_S parameter sync", fmt_time(d["t_sync_s"]), fmt_time(c["t_sync_s"])),
        ("t_X input transfer", fmt_time(d["t_xfer_s"]), fmt_time(c["t_xfer_s"])),
        ("bytes synchronised", fmt_bytes(d["sync_bytes"]), fmt_bytes(c["sync_bytes"])),
        ("bytes transferred", fmt_bytes(d["xfer_bytes"]), fmt_bytes(c["xfer_bytes"])),
    ]), html.P(f"Channel parallelism moves {doc['reduction']:.1f}× less data than data "
               f"parallelism here (the paper: {paper.OPTCNN['fig2_ratio']:.0f}×).",
               className="learn-verdict")]
    pin = f"{doc['layer']}=c={int(devices)}@{','.join(map(str, range(int(devices))))}"
    href = explorer_href("vgg16", devices, preset, "optcnn", batch, pins=[pin])
    return LF.dense_figure(doc), ours, href


# -- Figures 5-6: equations 2 and 3 -------------------------------------------------------------

def _elim_layout():
    key = K + "elim"
    return frame(key, "Node and edge elimination (Figures 5–6, equations 2 and 3)", [
        "Algorithm 1 shrinks the layer graph without losing the optimum. A node elimination "
        "removes a layer l_j with one input edge e1 = (l_i, l_j) and one output edge "
        "e2 = (l_j, l_k) and adds an edge e' whose cost table is equation 2: "
        "t_X(e', c_i, c_k) = min over c_j of t_C(l_j, c_j) + t_S(l_j, c_j) + t_R(l_j, c_j) "
        "+ t_X(e1, c_i, c_j) + t_X(e2, c_j, c_k) (t_R is zero unless c_j splits the "
        "reduction dimension k). An edge elimination merges two edges with the same ends by "
        "equation 3: t_X(e', c_i, c_j) = t_X(e1, c_i, c_j) + t_X(e2, c_i, c_j).",
        "Each step below is evaluated at the configurations the optimal plan finally gives "
        "the neighbours (c_i, c_k): by Theorem 1 the minimising c_j is the one the plan "
        "chose. Inception-v3's modules (Figure 6) need both kinds of step.",
    ], [
        control("model", choice(key, "model", [{"label": v[0], "value": k}
                                               for k, v in ELIM_MODELS.items()],
                                "inception_v3")),
        control("devices", choice(key, "devices", [2, 4], 4)),
        control("bandwidth", choice(key, "preset", BANDWIDTHS, PRESET)),
        # no bubble: the slider's own number box shows the step, and a bubble under the
        # slider covered the heading below it
        control("step", dcc.Slider(id=ids.learn(key, "step"), min=1, max=2, step=1, value=1,
                                   marks=None), wide=True),
        control("kind", choice(key, "kind", [{"label": "any step", "value": "any"},
                                             {"label": "edge eliminations only",
                                              "value": "edge"}], "any")),
        dcc.Store(id=ids.learn(key, "store")),
    ], [graph(key, "diagram", modebar=False), html.Div(id=ids.learn(key, "equation"),
                                        className="learn-equation"), graph(key)], [
        html.P("Figure 6 eliminates an Inception module's branches node by node, then merges "
               "the parallel edges, until two nodes remain."),
        html.P(f"Table 3: the final graph has K = {paper.OPTCNN['table3_k']} nodes for every "
               "network (LeNet-5, AlexNet, VGG-16, Inception-v3, ResNet-121...)."),
    ])


def elim_doc(model, devices, preset=PRESET):
    label, args, batch = ELIM_MODELS[model]
    req = _req(model, devices, batch, args, preset=preset)
    return session.learn_elimination(req)


def elim_controls(doc, index, kind, moved: bool):
    """:func:`elim_view` and the step slider's value: another model, device count or kind of
    step is another sequence of eliminations, so it starts again at step 1 (the slider kept
    the old model's step 158 while the text said "Elimination 87 of 87"); a step typed past
    the end is shown as the last one."""
    view = elim_view(doc, 1 if not moved else index, kind)
    last = view[-1]
    if not moved:
        value = 1 if index != 1 else dash.no_update
    else:
        i = max(1, min(int(index or 1), last))
        value = i if i != index else dash.no_update
    return (*view, value)


def elim_view(doc, index, kind):
    """The equation text with the numbers, the diagram, the figure, our numbers for step
    ``index`` (1-based, as the slider shows it) of the steps of ``kind``, and the slider's
    largest value."""
    steps = [s for s in doc["steps"] if kind != "edge" or s["kind"] == "edge"]
    if not steps:
        none = message_figure("no step of this kind")
        return "this graph needs no such step", none, none, [], 1
    i = max(1, min(int(index or 1), len(steps)))
    s = steps[i - 1]
    where = (f"Elimination {i} of {len(steps)}"
             + (" edge eliminations" if kind == "edge" else "")
             + f" (step {s['step'] + 1} of Algorithm 1's trace)")
    if s["kind"] == "node":
        r = s["rows"][s["best"]]
        eq = [html.Code(G.explain(f"t_X(e', c_i={s['c_i']}, c_k={s['c_k']}) = min over c_j "
                                  f"of [t_C + t_S + t_R + t_X(e1) + t_X(e2)]")),
              html.Br(),
              html.Code(G.explain(f"= {fmt_time(r['t_compute_s'])} + "
                                  f"{fmt_time(r['t_sync_s'])} + {fmt_time(r['t_reduce_s'])}"
                                  f" + {fmt_time(r['t_x_in_s'])} + {fmt_time(r['t_x_out_s'])} "
                                  f"= {fmt_time(s['value_s'])}   at c_j = {r['config']}")),
              html.P(G.explain(
                  f"{where}: node {s['node']} between {s['src']} and {s['dst']} "
                  f"({s['remaining_nodes']} nodes remain). Equation 2's minimiser "
                  f"c_j = {r['config']} {'is' if r['config'] == s['chosen'] else 'is not'} "
                  f"the plan's choice {s['chosen']} (Theorem 1)."))]
    else:
        eq = [html.Code(f"t_X(e', c_i={s['c_i']}, c_j={s['c_j']}) = t_X(e1) + t_X(e2) = "
                        f"{fmt_time(s['t_x1_s'])} + {fmt_time(s['t_x2_s'])} = "
                        f"{fmt_time(s['value_s'])}"),
              html.P(f"{where}: two edges {s['src']} → {s['dst']} merged "
                     f"({s['remaining_nodes']} nodes remain).")]
    nodes = sum(1 for x in doc["steps"] if x["kind"] == "node")
    edges = sum(1 for x in doc["steps"] if x["kind"] == "edge")
    ours = [table(("", "ours"), [
        ("layers", doc["layers"]), ("node / edge eliminations", f"{nodes} / {edges}"),
        ("final graph K", f"{len(doc['residual'])} nodes: {', '.join(doc['residual'])}"),
        ("equation 1 on the final graph", fmt_time(doc["check_s"])),
        ("optimal plan's equation 1", fmt_time(doc["objective_s"])),
    ])]
    return eq, LF.elimination_diagram(s), LF.elimination_figure(s), ours, len(steps)


# -- Figures 7-8 and Table 5 ----------------------------------------------------------------

def _scale_layout():
    key = K + "scale"
    return frame(key, "Throughput and communication against devices (Figures 7–8, Table 5)", [
        "Each strategy - data, model, one weird trick (OWT) and the layer-wise optimum - is "
        "searched at 1, 2, 4 … devices of P100 nodes (4 per node over InfiniBand) with the "
        "per-device batch held fixed, as in Figure 7; Figure 8's bytes per step are those of "
        "the largest count. Predicted by our cost model (no GPUs are used).",
        "Table 5 is the optimal plan for VGG-16 on one node of 4 GPUs: our search's "
        "configuration of every layer beside the paper's.",
    ], [
        control("model", choice(key, "model", [{"label": v, "value": k}
                                               for k, v in SCALE_MODELS.items()], "vgg16")),
        control("devices (most)", choice(key, "devices", [2, 4, 8, 16], 4)),
        control("batch per device", number(key, "batch", 16, 1, 128)),
    ], [graph(key), graph(key, "bytes"), html.Div(id=ids.learn(key, "table5"))], [
        html.P("Figure 7 at 16 GPUs (4 nodes): speed-up over one GPU"),
        table(("network", "layer-wise", "best other"),
              [(k, f"{a}×", f"{b}×") for k, (a, b) in paper.OPTCNN["speedup16"].items()]),
        html.P(paper.OPTCNN["fig8"]),
        html.H4("Table 5: VGG-16 on 4 GPUs"),
        table(("layers", "configuration"), paper.OPTCNN["table5"]),
    ])


def scale_figures(model, devices, batch):
    devices, batch = int(devices), int(batch)
    req = _req(model, devices, batch * devices, preset="p100-cluster")
    algos = ["data", "model", "owt", "optcnn"]
    sc = session.scaling(req, algos)
    cmp = session.compare(req, None, algos)
    lw = sc["optcnn"]
    others = [a for a in algos if a != "optcnn"]
    best_other = max((sc[a][-1] or 0, a) for a in others)
    base = lw[0] or 1.0
    comm = {a: cmp[a].get("comm_bytes") for a in algos if "error" not in cmp[a]}
    owt = comm.get("owt")
    rows = [(f"speed-up at {devices} devices", f"{lw[-1] / base:.1f}×" if lw[-1] else "–",
             f"best other ({best_other[1]}): {best_other[0] / base:.1f}×")]
    if owt and comm.get("optcnn"):
        rows.append(("bytes per step, OWT ÷ layer-wise", f"{owt / comm['optcnn']:.2f}×",
                     "paper: 1.2–2.5×"))
    ours = [table(("ours", "layer-wise", "other"), rows)]
    why = bytes_why(cmp)
    if why:
        ours.append(html.Div(id=ids.learn(K + "scale", "why-bytes"), className="learn-why",
                             children=[html.H4("Why layer-wise moves "
                                               + ("more" if why["more"] else "fewer")
                                               + " bytes than OWT here")]
                             + [html.P(t) for t in why["text"]]))
    t5 = table5_rows() if model == "vgg16" else []
    t5_view = [html.H4("Table 5, ours: VGG-16 on 4×P100 NVLink, batch 128"),
               table(("layers", "ours", "paper"), t5)] + table5_why_view() if t5 else []
    href = explorer_href(model, devices, "p100-cluster", "optcnn", batch * devices)
    return (CF.scaling_figure(sc, algos), CF.bytes_figure(cmp, algos), t5_view, ours, href)


def table5_rows() -> list:
    """Our optimal VGG-16 plan on 4 GPUs grouped as the paper's Table 5 rows."""
    plan = session.search(_req("vgg16", 4, 128))
    groups = [("2 × Conv + Pooling", 3), ("2 × Conv + Pooling", 3), ("3 × Conv + Pooling", 4),
              ("3 × Conv + Pooling", 4), ("3 × Conv + Pooling", 4), ("Fully-connected", 1),
              ("Fully-connected", 1), ("Fully-connected", 1)]
    layers = [la for la in plan["layers"] if la["op"] not in ("input", "placeholder")]
    convs = [la for la in layers if la["op"] in ("conv", "pool")]
    fcs = [la for la in layers if la["op"] == "linear"]
    out, i = [], 0
    for (name, n), (_, p) in zip(groups[:5], paper.OPTCNN["table5"][:5]):
        part = convs[i:i + n]
        i += n
        cfgs = sorted({la["config_label"] for la in part})
        out.append((name, ", ".join(cfgs), p))
    for la, (name, p) in zip(fcs, paper.OPTCNN["table5"][5:8]):
        out.append((f"{name} ({la['name']})", la["config_label"], p))
    return out


def _bytes_parts(doc: dict) -> dict:
    """A plan's bytes per step (parameter synchronisation, transfers between layers,
    reduce-scatter) and the time equation 1 charges for each."""
    i, b = doc.get("info") or {}, doc.get("breakdown") or {}
    return {"step_s": doc["predicted_step_time_s"], "bytes": doc["comm_bytes"],
            "sync_bytes": i.get("sync_bytes", 0.0), "xfer_bytes": i.get("transfer_bytes", 0.0),
            "reduce_bytes": i.get("reduce_bytes", 0.0), "sync_s": b.get("sync_s", 0.0),
            "xfer_s": b.get("transfer_s", 0.0), "reduce_s": b.get("reduce_s", 0.0)}


def _rate(nbytes: float, secs: float) -> str:
    return f"{nbytes / secs / 1e9:,.0f} GB/s" if secs > 0 and nbytes > 0 else "–"


def bytes_why(cmp: dict) -> dict | None:
    """Why the layer-wise optimum moves more (or fewer) bytes than OWT, in the numbers of
    the two plans ``cmp["owt"]``, ``cmp["optcnn"]``: ``{"more", "text"}`` (``None`` when
    either is missing).  Equation 1 minimises time, and our cost model charges a byte of
    parameter synchronisation (through a parameter server's links) more time than a byte
    moved between layers (every device's links at once): the search trades the one for the
    other whenever that saves time, whatever it does to the bytes."""
    o, l = cmp.get("owt") or {}, cmp.get("optcnn") or {}
    if not o or not l or "error" in o or "error" in l:
        return None
    o, l = _bytes_parts(o), _bytes_parts(l)
    more = l["bytes"] > o["bytes"]
    text = [f"Layer-wise moves {l['bytes'] / o['bytes']:.2f}× OWT's bytes per step "
            f"({fmt_bytes(l['bytes'])} against {fmt_bytes(o['bytes'])}) and its step takes "
            f"{fmt_time(l['step_s'])} against OWT's {fmt_time(o['step_s'])}: equation 1 "
            f"minimises time, not bytes."]
    per_sync = o["sync_s"] / o["sync_bytes"] if o["sync_bytes"] else 0.0
    per_xfer = l["xfer_s"] / l["xfer_bytes"] if l["xfer_bytes"] else 0.0
    if per_sync and per_xfer:
        text.append(
            f"Our cost model charges a byte of parameter synchronisation "
            f"{per_sync / per_xfer:.1f}× the time of a byte moved between layers: OWT "
            f"synchronises {fmt_bytes(o['sync_bytes'])} in {fmt_time(o['sync_s'])} "
            f"({_rate(o['sync_bytes'], o['sync_s'])}: every replica's gradients go through "
            f"one parameter server's links and back), while layer-wise moves "
            f"{fmt_bytes(l['xfer_bytes'])} between layers in {fmt_time(l['xfer_s'])} "
            f"({_rate(l['xfer_bytes'], l['xfer_s'])}: each device fetches over its own links, "
            f"all at once). Bytes are counted the same way for every strategy: what every "
            f"device receives, forward and backward, synchronisation both ways.")
    d_sync = o["sync_bytes"] - l["sync_bytes"]
    d_xfer = l["xfer_bytes"] + l["reduce_bytes"] - o["xfer_bytes"] - o["reduce_bytes"]
    if d_sync > 0 and d_xfer > 0:
        text.append(
            f"Against OWT, layer-wise synchronises {fmt_bytes(d_sync)} less "
            f"({fmt_time(o['sync_s'] - l['sync_s'])} saved) and moves {fmt_bytes(d_xfer)} more "
            f"between layers and in reduce-scatters "
            f"({fmt_time(l['xfer_s'] + l['reduce_s'] - o['xfer_s'] - o['reduce_s'])} spent): "
            f"{fmt_time(o['step_s'] - l['step_s'])} less per step"
            + (f" for {fmt_bytes(l['bytes'] - o['bytes'])} more." if more else "."))
    if more:
        text.append("The paper's Figure 8 (layer-wise 1.2–2.5× fewer bytes than OWT) measured "
                    "its own runtime's transfers; under our count its own Table 5 plan moves "
                    "more than OWT too (with VGG-16: the Table 5 tables of this tab).")
    return {"more": more, "text": text}


def _degrees(text: str) -> dict:
    """``"n=2, c=2"`` / ``"n=2,c=1"`` -> ``{"n": 2, "c": 2}`` (degrees of 1 dropped)."""
    out = {}
    for part in str(text).replace(" ", "").split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            if v.isdigit() and int(v) > 1:
                out[k] = int(v)
    return out


def table5_plans() -> dict:
    """VGG-16 on 4×P100 NVLink, batch 128: our optimum, the paper's Table 5 configuration
    of every layer evaluated by our cost model (every layer pinned), and OWT."""
    req = _req("vgg16", 4, 128)
    ours = session.search(req)
    layers = [la for la in ours["layers"] if la["op"] not in ("input", "placeholder")]
    convs = [la["name"] for la in layers if la["op"] in ("conv", "pool")]
    fcs = [la["name"] for la in layers if la["op"] == "linear"]
    sizes = (3, 3, 4, 4, 4)
    want, i = {}, 0
    for n, (_, cfg) in zip(sizes, paper.OPTCNN["table5"][:5]):
        for name in convs[i:i + n]:
            want[name] = _degrees(cfg)
        i += n
    for name, (_, cfg) in zip(fcs, paper.OPTCNN["table5"][5:8]):
        want[name] = _degrees(cfg)
    pins = [f"{name}=" + ",".join(f"{k}={v}" for k, v in d.items()) for name, d in want.items()
            if d]
    return {"request": req, "ours": ours, "owt": session.search(req, algo="owt"),
            "paper": session.search(req, pins), "paper_degrees": want}


def table5_why(plans: dict | None = None) -> dict:
    """Table 5's last conv block and fully-connected layers, ours against the paper's, in
    equation 1's terms: per layer the cost ``t_C + t_S + t_R + t_X`` (in and out, given our
    plan's neighbours) of our configuration and of the paper's, and the three plans' step
    times and bytes."""
    plans = plans or table5_plans()
    req, ours = plans["request"], plans["ours"]
    chosen = {la["name"]: la["config_label"] for la in ours["layers"]}
    names = [la["name"] for la in ours["layers"] if la["op"] in ("conv", "linear")][-6:]
    rows = []
    for name in names:
        cands = session.candidates(req, name, ours)
        mine = next((r for r in cands if r["chosen"]), None)
        theirs = [r for r in cands if _degrees(r["degrees"]) == plans["paper_degrees"]
                  .get(name) and r.get("total_ms") is not None]
        best = min(theirs, key=lambda r: r["total_ms"]) if theirs else None
        rows.append({"layer": name, "ours": chosen.get(name, ""),
                     "ours_ms": mine.get("total_ms") if mine else None,
                     "ours_sync_ms": mine.get("t_sync_ms") if mine else None,
                     "paper": best["config"] if best else "–",
                     "paper_ms": best["total_ms"] if best else None,
                     "paper_sync_ms": best["t_sync_ms"] if best else None})
    return {"rows": rows, "plans": {k: _bytes_parts(plans[k]) for k in ("ours", "paper", "owt")}}


def table5_why_view() -> list:
    """The Table 5 comparison as the page shows it (a table of the three plans and one of
    the last layers)."""
    try:
        why = table5_why()
    except (ExplorerError, ValueError) as exc:
        return [html.P(f"the paper's Table 5 plan cannot be evaluated here: {exc}")]
    p = why["plans"]
    label = {"ours": "ours (layer-wise optimum)", "paper": "the paper's Table 5, our costs",
             "owt": "OWT"}
    plans = table(("plan", "step", "bytes", "synchronisation", "between layers"),
                  [(label[k], fmt_time(v["step_s"]), fmt_bytes(v["bytes"]),
                    fmt_bytes(v["sync_bytes"]), fmt_bytes(v["xfer_bytes"] + v["reduce_bytes"]))
                   for k, v in p.items()])

    def ms(v):
        return "–" if v is None else f"{v:.3f} ms"
    layers = table(("layer", "ours", "t_C+t_S+t_R+t_X", "of which t_S", "paper's",
                    "t_C+t_S+t_R+t_X", "of which t_S"),
                   [(r["layer"], r["ours"], ms(r["ours_ms"]), ms(r["ours_sync_ms"]), r["paper"],
                     ms(r["paper_ms"]), ms(r["paper_sync_ms"])) for r in why["rows"]])
    d_paper = p["paper"]["step_s"] - p["ours"]["step_s"]
    return [html.Div(id=ids.learn(K + "scale", "why-table5"), className="learn-why", children=[
        html.H4("Table 5: why our last conv block and fully-connected layers differ"),
        plans,
        html.P(f"Evaluated by our cost model, the paper's Table 5 plan takes "
               f"{fmt_time(d_paper)} more per step than ours and moves "
               f"{fmt_bytes(p['paper']['bytes'])}, against OWT's "
               f"{fmt_bytes(p['owt']['bytes'])}: it differs from OWT only by h2 w2 on the last "
               f"conv block and fewer devices on the last fully-connected layer, and each "
               f"change of layout moves activations while h2 w2 keeps 4 replicas of the "
               f"weights to synchronise, as n4 does."),
        layers,
        html.P("Per layer, given our plan's neighbours (equation 1's terms that change with "
               "the layer's own choice): our n2 c2 halves the weight replicas of the last conv "
               "block, so its t_S is a fraction of h2 w2's (which synchronises 4 replicas, as "
               "n4 does), and pays for it in transfers between layers; on the "
               "fully-connected layers a row-parallel k split needs only part of the input on "
               "each device, where c4 fetches all of it."),
    ])]


# -- wiring --------------------------------------------------------------------------------------

LAYOUTS = {K + "dims": _dims_layout, K + "dense": _dense_layout, K + "elim": _elim_layout,
           K + "scale": _scale_layout}


def _err(exc) -> str:
    return f"error: {exc}"


def register(app: dash.Dash) -> None:
    d = K + "dims"

    @app.callback(Output(ids.learn(d, "layer"), "options"), Output(ids.learn(d, "layer"), "value"),
                  Output(ids.learn(d, "config"), "options"),
                  Output(ids.learn(d, "config"), "value"),
                  Output(ids.learn(d, "times"), "figure"), Output(ids.learn(d, "fig"), "figure"),
                  Output(ids.learn(d, "reads"), "figure"), Output(ids.learn(d, "ours"), "children"),
                  Output(ids.learn(d, "link"), "href"), Output(ids.learn(d, "error"), "children"),
                  Input(ids.learn(d, "devices"), "value"), Input(ids.learn(d, "batch"), "value"),
                  Input(ids.learn(d, "layer"), "value"), Input(ids.learn(d, "config"), "value"),
                  Input(ids.learn(d, "preset"), "value"))
    def _dims(devices, batch, layer, degrees, preset):
        # one callback: a new layer, device count or batch re-lists the configurations (the
        # shown one kept when it still exists, else the fastest) and redraws at once
        nothing = (dash.no_update,) * 9
        if not devices or not batch or not preset:
            return (*nothing, "error: give the batch as a whole number from 1 to 512")
        try:
            layers, layer, configs, best, rows = dims_options(devices, batch, layer, preset)
            if degrees not in {c["value"] for c in configs}:
                degrees = best
            return (layers, layer, configs, degrees,
                    *dims_figures(devices, batch, layer, degrees, rows, preset), "")
        except (ExplorerError, ValueError, KeyError, StopIteration) as exc:
            m = message_figure(str(exc))
            return (*(dash.no_update,) * 4, m, m, m, [], dash.no_update, _err(exc))

    e = K + "dense"

    @app.callback(Output(ids.learn(e, "fig"), "figure"), Output(ids.learn(e, "ours"), "children"),
                  Output(ids.learn(e, "link"), "href"), Output(ids.learn(e, "error"), "children"),
                  Input(ids.learn(e, "devices"), "value"), Input(ids.learn(e, "batch"), "value"),
                  Input(ids.learn(e, "preset"), "value"))
    def _dense(devices, batch, preset):
        if not devices or not batch or not preset:
            return (dash.no_update,) * 3 + ("error: give the batch as a whole number from 1 "
                                            "to 1024",)
        try:
            return (*dense_figures(devices, batch, preset), "")
        except (ExplorerError, ValueError) as exc:
            return message_figure(str(exc)), [], dash.no_update, _err(exc)

    m = K + "elim"

    @app.callback(Output(ids.learn(m, "store"), "data"), Output(ids.learn(m, "link"), "href"),
                  Output(ids.learn(m, "error"), "children"),
                  Input(ids.learn(m, "model"), "value"), Input(ids.learn(m, "devices"), "value"),
                  Input(ids.learn(m, "preset"), "value"))
    def _elim_doc(model, devices, preset):
        if model not in ELIM_MODELS or not devices or not preset:
            raise dash.exceptions.PreventUpdate
        label, args, batch = ELIM_MODELS[model]
        href = explorer_href(model, devices, preset, "optcnn", batch, args)
        try:
            return elim_doc(model, devices, preset), href, ""
        except (ExplorerError, ValueError) as exc:
            return None, href, _err(exc)

    @app.callback(Output(ids.learn(m, "equation"), "children"),
                  Output(ids.learn(m, "diagram"), "figure"), Output(ids.learn(m, "fig"), "figure"),
                  Output(ids.learn(m, "ours"), "children"),
                  Output(ids.learn(m, "step"), "max"), Output(ids.learn(m, "step"), "value"),
                  Input(ids.learn(m, "store"), "data"), Input(ids.learn(m, "step"), "value"),
                  Input(ids.learn(m, "kind"), "value"))
    def _elim(doc, index, kind):
        if not doc:
            raise dash.exceptions.PreventUpdate
        return elim_controls(doc, index, kind, dash.ctx.triggered_id == ids.learn(m, "step"))

    s = K + "scale"

    @app.callback(Output(ids.learn(s, "fig"), "figure"), Output(ids.learn(s, "bytes"), "figure"),
                  Output(ids.learn(s, "table5"), "children"),
                  Output(ids.learn(s, "ours"), "children"), Output(ids.learn(s, "link"), "href"),
                  Output(ids.learn(s, "error"), "children"),
                  Input(ids.learn(s, "model"), "value"), Input(ids.learn(s, "devices"), "value"),
                  Input(ids.learn(s, "batch"), "value"))
    def _scale(model, devices, batch):
        if not model or not devices or not batch:
            return (dash.no_update,) * 5 + ("error: give the batch per device as a whole "
                                            "number from 1 to 128",)
        try:
            return (*scale_figures(model, devices, batch), "")
        except (ExplorerError, ValueError) as exc:
            mf = message_figure(str(exc))
            return mf, mf, [], [], dash.no_update, _err(exc)
