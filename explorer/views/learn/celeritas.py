"""Learn scenarios from Celeritas ("Celeritas: Fast Optimizer for Large Dataflow Graphs"):
Figure 3 (M-TOPO against DFS-TOPO, and Optimal Operation Fusion on a small DAG) and Tables
3-4 (step time and placement time of every placer on the same graph and simulator)."""

from __future__ import annotations

import dash
from dash import Input, Output, html

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import fmt
from explorer.views import glossary as G
from explorer.views import ids
from explorer.views.figures import learn as LF
from explorer.views.figures.compare import message_figure
from explorer.views.learn import paper
from explorer.views.learn.common import (
    choice,
    control,
    explorer_href,
    fmt_time,
    frame,
    graph,
    number,
    table,
)

K = "celeritas-"
SCENARIOS = {"pipeline": "Celeritas Fig. 2: the pipeline",
             "orders": "Celeritas Fig. 3: orders and fusion",
             "tables": "Celeritas Tables 3–4"}
PRESET = "v100-pcie-4"
MODELS = {"seq2seq": ("NMT: LSTM seq2seq, 1 layer, hidden 256", "NMT",
                      {"layers": "1", "hidden": "256", "src_steps": "4", "tgt_steps": "4",
                       "vocab": "1000"}, 16),
          "inception_v3": ("Inception-v3, 75×75 input", "Inception_V3", {"image_size": "75"}, 8)}


def _pipeline_layout():
    key = K + "pipeline"
    return frame(key, "Celeritas, stage by stage (Figure 2)", [
        "Celeritas places a training graph of thousands of operators on a few devices in "
        "four stages. Standard Evaluation estimates every operator's time, memory and output "
        "size once. CPD-TOPO orders the operators so that each critical path stays "
        "together. Optimal Operation Fusion merges operators consecutive in that order into "
        "clusters - far fewer nodes and a lower CCR. Adjusting Placement then assigns the "
        "clusters in order, keeping each on its predecessor's device unless another device "
        "starts it sooner.",
        "Below, each stage's numbers on the chosen model: the graph it works on shrinks from "
        "operators to clusters to devices, and the step time known after it. Our Celeritas "
        "adds a simulated refinement after Adjusting Placement (not in the paper).",
    ], [
        control("model", choice(key, "model", [{"label": v[0], "value": k}
                                               for k, v in MODELS.items()], "seq2seq")),
        control("devices", choice(key, "devices", [2, 4], 4)),
    ], [graph(key)], [
        html.P(paper.CELERITAS["fig2"]),
        html.H4("Table 2: nodes and CCR before and after merging"),
        table(("model", "nodes", "CCR", "nodes after", "CCR after"), paper.CELERITAS["table2"]),
    ])


def _stage_numbers(s: dict) -> str:
    """One stage's numbers in words."""
    name = s["stage"]
    if name == "Standard Evaluation":
        return (f"{s['nodes']:,} operators, {s['edges']:,} edges; on one device "
                f"{fmt.seconds(s['time_s'])}, {fmt.bytes_(s['memory_bytes'])}; "
                f"CCR {s['ccr']:.3g}")
    if name == "CPD-TOPO":
        return (f"{s['nodes']:,} operators in one order; critical path "
                f"{fmt.seconds(s['critical_path_s'])} (operators and transfers)")
    if name == "Optimal Operation Fusion":
        return (f"{s['nodes']:,} clusters (at most R = {s['R']} operators and M = "
                f"{fmt.bytes_(s['M_bytes'])} each; the largest {s['largest_cluster']}), "
                f"{s['edges']:,} edges, CCR {s['ccr']:.3g}; transfers between clusters "
                f"{fmt.seconds(s['cut_comm_s'])}")
    if name == "Adjusting Placement":
        return (f"{s['nodes']} of {s['devices']} devices used; {s['moves']} clusters moved "
                f"off their predecessor's device; placer's estimate "
                f"{fmt.seconds(s['placer_step_s'])}, simulated {fmt.seconds(s['step_s'])}")
    return f"{s['moves']} moves kept; simulated {fmt.seconds(s['step_s'])}"


def pipeline_view(model, devices):
    """Celeritas' four stages on ``model`` over ``devices``: the figure, the stages' table
    and the link to the same placement in the explorer."""
    label, paper_name, args, batch = MODELS[model]
    req = session.Request(model=model, devices=int(devices), preset=PRESET, batch=batch,
                          model_args=dict(args), algo="celeritas")
    doc = session.learn_pipeline(req)
    rows = [html.Tr([html.Td(G.term(s["stage"]) if s["stage"] != "refinement" else
                             "refinement (ours, not in the paper)"),
                     html.Td(G.explain(_stage_numbers(s))),
                     html.Td("–" if s["seconds"] is None else fmt.seconds(s["seconds"]))])
            for s in doc["stages"]]
    first = doc["stages"][0]
    ours = [html.Table(className="learn-table", id=ids.learn(K + "pipeline", "stages"),
                       children=[html.Thead(html.Tr([html.Th("stage"), html.Th("its numbers"),
                                                     html.Th("time it took")])),
                                 html.Tbody(rows)]),
            html.P(f"{label}: {first['nodes']:,} operators on {doc['devices']} devices, "
                   f"{fmt.seconds(doc['step_s'])} per step simulated against "
                   f"{fmt.seconds(doc['one_device_s'])} on one device"
                   + (" (out of memory)" if doc["oom"] else "") + ".",
                   className="learn-verdict")]
    href = explorer_href(model, devices, PRESET, "celeritas", batch, args)
    return LF.pipeline_figure(doc), ours, href


def _orders_layout():
    key = K + "orders"
    return frame(key, "Topological orders and operation fusion (Figure 3)", [
        "A placer that fills devices one after another follows a topological order. M-TOPO "
        "(Baechi) keeps a FIFO queue of ready operators, so it visits the graph breadth "
        "first and interleaves independent chains; DFS-TOPO puts a node's newly ready "
        "children at the head of the queue and follows each chain to its end. Split over "
        "devices, the first order cuts the chains' edges - each cut is a tensor sent between "
        "devices - and the second does not.",
        "Celeritas then fuses consecutive operators of the CPD-TOPO order into clusters by a "
        "dynamic program over breakpoints (Algorithm 1, equations 4-6), so the coarse graph "
        "stays acyclic. Numbers show each node's position in the order.",
    ], [
        control("chains", number(key, "chains", 4, 1, 12)),
        control("chain length", number(key, "length", 2, 1, 12)),
        control("devices", choice(key, "devices", [2, 3, 4], 2)),
    ], [graph(key)], [html.P(paper.CELERITAS["fig3"])])


def orders_view(chains, length, devices):
    doc = session.learn_orders(chains, length, devices)
    names = doc["names"]
    rows = [(k, v["cut_edges"], " ".join(names[i] for i in v["order"]))
            for k, v in doc["orders"].items()]
    clusters = ["{" + ", ".join(names[i] for i in c) + "}" for c in doc["fusion"]["clusters"]]
    ours = [table(("order", "edges cut", "order of nodes"), rows),
            html.P(f"Fusion over CPD-TOPO: {len(clusters)} clusters {' '.join(clusters)}; "
                   f"communication between clusters {doc['fusion']['cut_comm']:.3g}.",
                   className="learn-verdict")]
    return LF.orders_figure(doc), ours


def _transposed(columns, rows: dict):
    """A paper table with one row per placer and one column per model (fits the aside)."""
    models = list(rows)
    return table(("placer",) + tuple(models),
                 [(c,) + tuple(rows[m][i] for m in models) for i, c in enumerate(columns)])


def _tables_layout():
    key = K + "tables"
    return frame(key, "Every placer on the same graph (Tables 3–4)", [
        "Celeritas places the training graph's operators on devices: Standard Evaluation "
        "gives each operator's time and memory, fusion coarsens the graph, and Adjusting "
        "Placement assigns clusters along the CPD-TOPO order. Its baselines - Baechi's "
        "m-TOPO, m-ETF and m-SCT, METIS, Order-Place and one device - place the same graph, "
        "and one simulator times every placement.",
        "Our graphs are scaled down to run here in seconds; the paper's are full size on "
        "4 V100s, so compare the ranking, not the seconds.",
    ], [
        control("model", choice(key, "model", [{"label": v[0], "value": k}
                                               for k, v in MODELS.items()], "seq2seq")),
        control("devices", choice(key, "devices", [2, 4], 4)),
    ], [graph(key)], [
        html.H4("Table 3: step time (s) on 4 GPUs"),
        _transposed(paper.CELERITAS["table3_columns"], paper.CELERITAS["table3"]),
        html.H4("Table 4: placement time (s)"),
        _transposed(paper.CELERITAS["table4_columns"], paper.CELERITAS["table4"]),
    ])


def tables_view(model, devices):
    label, paper_name, args, batch = MODELS[model]
    req = session.Request(model=model, devices=int(devices), preset=PRESET, batch=batch,
                          model_args=dict(args), algo="celeritas")
    rows = session.placement_compare(req)
    ok = [r for r in rows if "error" not in r]
    best = min(ok, key=lambda r: r["step_time_s"]) if ok else None
    out = [(r["algo"], "error: " + r["error"] if "error" in r else
            fmt_time(r["step_time_s"]) + (" (OOM)" if r.get("oom") else ""),
            "" if "error" in r else fmt_time(r["search_time_s"])) for r in rows]
    ours = [html.P(f"{label}: the paper's row is {paper_name}.", className="learn-verdict"),
            table(("placer", "step time (simulated)", "placement time"), out)]
    if best:
        ours.append(html.P(f"fastest placement here: {best['algo']}", className="learn-verdict"))
    href = explorer_href(model, devices, PRESET, "celeritas", batch, args)
    return LF.placement_algorithms_figure(rows), ours, href


LAYOUTS = {K + "pipeline": _pipeline_layout, K + "orders": _orders_layout,
           K + "tables": _tables_layout}


def register(app: dash.Dash) -> None:
    p = K + "pipeline"

    @app.callback(Output(ids.learn(p, "fig"), "figure"), Output(ids.learn(p, "ours"), "children"),
                  Output(ids.learn(p, "link"), "href"), Output(ids.learn(p, "error"), "children"),
                  Input(ids.learn(p, "model"), "value"), Input(ids.learn(p, "devices"), "value"))
    def _pipeline(model, devices):
        if model not in MODELS or not devices:
            raise dash.exceptions.PreventUpdate
        try:
            return (*pipeline_view(model, devices), "")
        except (ExplorerError, ValueError) as exc:
            return message_figure(str(exc)), [], dash.no_update, f"error: {exc}"

    o = K + "orders"

    @app.callback(Output(ids.learn(o, "fig"), "figure"), Output(ids.learn(o, "ours"), "children"),
                  Output(ids.learn(o, "error"), "children"),
                  Input(ids.learn(o, "chains"), "value"), Input(ids.learn(o, "length"), "value"),
                  Input(ids.learn(o, "devices"), "value"))
    def _orders(chains, length, devices):
        if chains in (None, "") or length in (None, "") or not devices:
            return dash.no_update, dash.no_update, "error: give whole numbers ≥ 1"
        try:
            return (*orders_view(chains, length, devices), "")
        except (ExplorerError, ValueError) as exc:
            return message_figure(str(exc)), [], f"error: {exc}"

    @app.callback(Output(ids.learn(o, "link"), "href"), Input(ids.learn(o, "devices"), "value"))
    def _orders_link(devices):
        label, _, args, batch = MODELS["seq2seq"]
        return explorer_href("seq2seq", devices or 2, PRESET, "celeritas", batch, args)

    t = K + "tables"

    @app.callback(Output(ids.learn(t, "fig"), "figure"), Output(ids.learn(t, "ours"), "children"),
                  Output(ids.learn(t, "link"), "href"), Output(ids.learn(t, "error"), "children"),
                  Input(ids.learn(t, "model"), "value"), Input(ids.learn(t, "devices"), "value"))
    def _tables(model, devices):
        if model not in MODELS or not devices:
            raise dash.exceptions.PreventUpdate
        try:
            return (*tables_view(model, devices), "")
        except (ExplorerError, ValueError) as exc:
            return message_figure(str(exc)), [], dash.no_update, f"error: {exc}"


__all__ = ["LAYOUTS", "SCENARIOS", "register", "orders_view", "tables_view", "pipeline_view"]
