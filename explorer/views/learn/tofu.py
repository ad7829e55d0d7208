"""Learn scenarios from Tofu (Wang, Huang, Li: "Supporting Very Large Models using Automatic
Dataflow Graph Partitioning", EuroSys 2019): Figures 1-3 (conv1d in TDL and the strategies the
interval analysis finds) and Figures 10-11 (partition algorithms compared, Tofu's tiles)."""

from __future__ import annotations

import dash
from dash import Input, Output, html

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import glossary as G
from explorer.views import ids
from explorer.views.figures import learn as LF
from explorer.views.figures.compare import message_figure
from explorer.views.tofu import strip_view
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

K = "tofu-"
SCENARIOS = {"conv1d": "Tofu Fig. 1–3: conv1d in TDL",
             "recursion": "Tofu Fig. 6: recursive partitioning", "algos": "Tofu Fig. 10–11"}
TDL_SOURCE = """@tofu.op
def conv1d(data, filters):
    return lambda b, co, x: Sum(lambda ci, dx: data[b, ci, x + dx] * filters[ci, co, dx])"""
MODELS = {"lstm": ("RNN: 2-layer LSTM, hidden 512 (RNN-4-8K, scaled down)",
                   {"layers": "2", "hidden": "512", "steps": "4"}, 64),
          "wresnet": ("Wide-ResNet-50 ×2, 64×64 input (WResNet-152-10, scaled down)",
                      {"depth": "50", "width": "2", "image_size": "64"}, 8)}
PRESET = "k80-pcie-8"


def _conv1d_layout():
    key = K + "conv1d"
    return frame(key, "conv1d written in TDL and its partition strategies (Figures 1–3)", [
        "Tofu describes what an operator computes, not how: conv1d is a lambda from output "
        "coordinates (b, co, x) to a sum over ci and dx (Figure 3). Tofu's interval analysis "
        "runs the description on symbolic intervals to find every partition-n-reduce "
        "strategy: split an output coordinate (workers compute slices that are concatenated) "
        "or split a reduction variable (workers compute partial outputs that are summed, "
        "Figure 2(b)).",
        "The chart shows, for the strategy you pick, the interval of every axis each worker "
        "reads from each input - computed now by our TDL analysis.",
    ], [
        control("batch b", number(key, "batch", 4, 1, 64)),
        control("in channels ci", number(key, "ci", 4, 1, 64)),
        control("out channels co", number(key, "co", 4, 1, 64)),
        control("data length", number(key, "length", 16, 1, 256)),
        control("window dx", number(key, "window", 3, 1, 64)),
        control("workers", choice(key, "workers", [2, 3, 4, 8], 2)),
        control("strategy", choice(key, "strategy", [], None)),
    ], [html.Pre(TDL_SOURCE, className="learn-code"), graph(key)], [
        html.P("Figure 2 shows two of conv1d's strategies on two workers:"),
        table(("strategy", "what each worker reads"), paper.TOFU["fig2"]),
    ])


def conv1d_view(batch, ci, co, length, window, workers, strategy):
    doc = session.learn_conv1d(batch, ci, co, length, window, workers)
    opts = [{"label": s["text"].split(": ", 1)[1].split(":")[0], "value": i}
            for i, s in enumerate(doc["strategies"])]
    if not opts:
        raise ExplorerError("no strategy: every dimension is smaller than the workers")
    if strategy is None or not 0 <= int(strategy) < len(opts):
        strategy = 0
    s = doc["strategies"][int(strategy)]
    rows = []
    for t in doc["strategies"]:
        what = t["text"].split(": ", 1)[1]
        rows.append((what.split(":")[0], "; ".join(
            f"{n} {r['layout']}" + (f" (halo {','.join(map(str, r['halo'].values()))})" if r["halo"]
                                    else "") for n, r in t["reads"].items())))
    sym = [(f"worker {w}", "; ".join(f"{n}[" + ", ".join(f"{a}..{b}" for a, b in r["symbolic"][w])
                                     + "]" for n, r in s["reads"].items()))
           for w in range(doc["workers"])]
    ours = [html.H4(f"{len(rows)} strategies found for {doc['workers']} workers"),
            table(("strategy", "inputs"), rows),
            html.H4("symbolic intervals of the shown strategy"),
            table(("", "reads"), sym)]
    return opts, int(strategy), LF.intervals_figure(s, doc["shapes"]), ours


def _algos_layout():
    key = K + "algos"
    return frame(key, "Partition algorithms compared, and Tofu's partition (Figures 10–11)", [
        "Tofu partitions every operator of the training dataflow graph (forward and "
        "backward) recursively in halves with dynamic programming over the coarsened graph. "
        "The baselines of §7.3 run on the same graph and machine model: AllRow-Greedy "
        "(every tensor split along its first dimension), Spartan (largest tensor first), "
        "EqualChop (Tofu's search, one dimension per tensor) and ICML18 (no output "
        "reduction).",
        "Below: predicted time and bytes per step on 8×K80 over PCIe (Tofu's machine), and "
        "Figure 11 - the tiles of the convolutions' weights and activations, one colour per "
        "worker.",
    ], [
        control("model", choice(key, "model", [{"label": v[0], "value": k}
                                               for k, v in MODELS.items()], "lstm")),
        control("workers", choice(key, "workers", [2, 4, 8], 8)),
    ], [graph(key), html.Div(id=ids.learn(key, "strip"), className="learn-strip")], [
        table(("algorithm", "Figure 10 (8 GPUs)"), paper.TOFU["fig10"]),
        html.P(paper.TOFU["fig11"]),
    ])


def algos_view(model, workers):
    label, args, batch = MODELS[model]
    req = session.Request(model=model, devices=int(workers), preset=PRESET, batch=batch,
                          model_args=dict(args), algo="tofu")
    cmp = session.tofu_compare(req)
    blocks = session.tofu_strip(req, "tofu")
    t = cmp["tofu"]["predicted_step_time_s"]
    rows = [(a, fmt_time(v["predicted_step_time_s"]),
             f"{(v['predicted_step_time_s'] / t - 1) * 100:+.0f}%" if t else "–",
             fmt_bytes(v["comm_bytes"])) for a, v in cmp.items() if "error" not in v]
    ours = [table(("algorithm", "time per step", "vs Tofu", "communication"), rows)]
    href = explorer_href(model, workers, PRESET, "tofu", batch, args)
    return LF.tofu_algorithms_figure(cmp), strip_view(blocks), ours, href


def _recursion_layout():
    key = K + "recursion"
    return frame(key, "Recursive partitioning, step by step (Section 5.2, Figure 6)", [
        "Searching every way to cut every tensor among k workers at once explodes. Tofu "
        "partitions recursively instead: each recursion step cuts every worker group of the "
        "previous step in two (k = 2^m workers take m steps), one partition-n-reduce "
        "strategy per operator and one axis per tensor, chosen by dynamic programming over "
        "the coarsened graph and applied alike to every group.",
        "The tree shows the worker groups after each recursion step (hover a group for the "
        "cut its step chose); the bars show the bytes each step adds to a training step - "
        "their sum is the plan's communication.",
    ], [
        control("model", choice(key, "model", [{"label": v[0], "value": k}
                                               for k, v in MODELS.items()], "lstm")),
        control("workers", choice(key, "workers", [2, 4, 8], 8)),
    ], [graph(key), graph(key, "steps")], [
        html.P(paper.TOFU["fig6"]),
        html.H4("Table 1: search time for 8 workers"),
        table(("search", "WResNet-152", "RNN-10"), paper.TOFU["table1"]),
        html.P(paper.TOFU["theorem"]),
    ])


def _count(d: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in d.items())


def recursion_view(model, workers):
    """The recursion of Tofu's plan on ``model`` over ``workers``: the tree and step figures,
    the steps' table and the link to the same plan in the explorer."""
    label, args, batch = MODELS[model]
    req = session.Request(model=model, devices=int(workers), preset=PRESET, batch=batch,
                          model_args=dict(args), algo="tofu")
    doc = session.learn_recursion(req)
    rows = []
    for s in doc["steps"]:
        cut = "; ".join(f"{kind}: {_count(axes)}" for kind, axes in s["tensors"].items())
        top = "; ".join(f"{t['op']} ({t['strategy']}, {fmt_bytes(t['bytes'])})"
                        for t in s["top"]) or "–"
        big = "; ".join(f"{w['tensor'].split(':', 1)[-1]} "
                        f"{'replicated' if w['axis'] < 0 else 'axis ' + str(w['axis'])} → "
                        + "×".join(map(str, w["grid"])) for w in s["largest"]) or "–"
        rows.append((f"{s['step']} (×{s['k']})",
                     f"{s['groups_before']} → {s['groups_after']} of {s['group_workers']}",
                     cut, big, _count(s["ops"]), top, fmt_bytes(s["delta_bytes"]),
                     fmt_bytes(s["total_bytes"])))
    n = len(doc["steps"])
    co = doc["coarsening"]
    ours = [html.H4(f"{n} recursion step{'s' if n != 1 else ''} for {doc['workers']} workers",
                    id=ids.learn(K + "recursion", "count")),
            table((G.term("step", "recursion step"), "groups (workers each)",
                   "tensors cut (count per axis)", "largest weights: axis → grid",
                   G.term("operators' strategies",
                                                       "partition-n-reduce"),
                   "most bytes added", "bytes added", "total so far"), rows),
            html.P(G.explain(
                f"Total: {fmt_bytes(doc['total_bytes'])} per training step, on the links "
                f"{fmt_time(doc['objective_s'])}. The coarsened graph has "
                f"{co.get('ops_after', '?')} operator groups (of {co.get('ops_before', '?')} "
                f"operators)."), className="learn-verdict")]
    href = explorer_href(model, workers, PRESET, "tofu", batch, args)
    return LF.recursion_tree_figure(doc), LF.recursion_steps_figure(doc), ours, href


LAYOUTS = {K + "conv1d": _conv1d_layout, K + "recursion": _recursion_layout,
           K + "algos": _algos_layout}


def register(app: dash.Dash) -> None:
    c = K + "conv1d"
    parts = ("batch", "ci", "co", "length", "window", "workers")

    @app.callback(Output(ids.learn(c, "strategy"), "options"),
                  Output(ids.learn(c, "strategy"), "value"),
                  Output(ids.learn(c, "fig"), "figure"), Output(ids.learn(c, "ours"), "children"),
                  Output(ids.learn(c, "error"), "children"),
                  *[Input(ids.learn(c, p), "value") for p in parts],
                  Input(ids.learn(c, "strategy"), "value"))
    def _conv1d(*values):
        if any(v in (None, "") for v in values[:-1]):
            return dash.no_update, dash.no_update, dash.no_update, dash.no_update, \
                "error: fill every size with a whole number in its range (≥ 1)"
        try:
            return (*conv1d_view(*values), "")
        except (ExplorerError, ValueError) as exc:
            return [], None, message_figure(str(exc)), [], f"error: {exc}"

    a = K + "algos"

    @app.callback(Output(ids.learn(a, "fig"), "figure"), Output(ids.learn(a, "strip"), "children"),
                  Output(ids.learn(a, "ours"), "children"), Output(ids.learn(a, "link"), "href"),
                  Output(ids.learn(a, "error"), "children"),
                  Input(ids.learn(a, "model"), "value"), Input(ids.learn(a, "workers"), "value"))
    def _algos(model, workers):
        if model not in MODELS or not workers:
            raise dash.exceptions.PreventUpdate
        try:
            return (*algos_view(model, workers), "")
        except (ExplorerError, ValueError) as exc:
            return message_figure(str(exc)), [], [], dash.no_update, f"error: {exc}"

    r = K + "recursion"

    @app.callback(Output(ids.learn(r, "fig"), "figure"), Output(ids.learn(r, "steps"), "figure"),
                  Output(ids.learn(r, "ours"), "children"), Output(ids.learn(r, "link"), "href"),
                  Output(ids.learn(r, "error"), "children"),
                  Input(ids.learn(r, "model"), "value"), Input(ids.learn(r, "workers"), "value"))
    def _recursion(model, workers):
        if model not in MODELS or not workers:
            raise dash.exceptions.PreventUpdate
        try:
            return (*recursion_view(model, workers), "")
        except (ExplorerError, ValueError) as exc:
            return message_figure(str(exc)), message_figure(""), [], dash.no_update, \
                f"error: {exc}"

    # the conv1d scenario links to Tofu on the scaled-down Wide-ResNet
    @app.callback(Output(ids.learn(c, "link"), "href"), Input(ids.learn(c, "workers"), "value"))
    def _conv1d_link(workers):
        label, args, batch = MODELS["wresnet"]
        return explorer_href("wresnet", workers or 2, PRESET, "tofu", batch, args)


__all__ = ["LAYOUTS", "SCENARIOS", "register", "conv1d_view", "algos_view", "recursion_view"]
