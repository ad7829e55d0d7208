"""Compare panel and its figures, fed by the real engine (session.compare / session.scaling)."""

import pytest

from explorer import service as session
from explorer.views import compare as C
from explorer.views.figures import compare as F

REQ = dict(model="lenet5", preset="p100-cluster", devices=4)


@pytest.fixture(scope="module")
def results():
    return session.compare(session.Request(batch=16, **REQ))


def _totals(fig):
    """Stacked bar heights per category, summed over the bar traces."""
    out = {}
    for tr in fig.data:
        for x, y in zip(tr.x, tr.y):
            out[x] = out.get(x, 0.0) + y
    return out


def test_time_figure_four_strategies_three_stacks(results):
    fig = F.time_figure(results)
    assert [tr.name for tr in fig.data] == ["compute", "transfer", "sync"]
    assert all(tr.type == "bar" for tr in fig.data) and fig.layout.barmode == "stack"
    cats = [F.label(a) for a in ("data", "model", "owt", "megatron", "optcnn")]
    assert list(fig.layout.xaxis.categoryarray) == cats
    totals = _totals(fig)
    assert set(totals) == set(cats)
    for a in ("data", "model", "owt", "megatron", "optcnn"):
        assert totals[F.label(a)] == pytest.approx(
            results[a]["breakdown"]["total_s"] * 1e3, rel=1e-6)
    best = totals[F.label("optcnn")]
    for a in ("data", "model", "owt", "megatron"):
        assert best <= totals[F.label(a)] * (1 + 1e-9)
    # totals printed on top of the bars
    texts = [an.text for an in fig.layout.annotations]
    assert any(t.startswith(F._num(best)) for t in texts)


def test_infeasible_strategy_shows_message():
    res = session.compare(session.Request(batch=6, **REQ))
    assert "error" in res["data"]
    fig = F.time_figure(res)
    xs = {x for tr in fig.data for x in tr.x}
    assert F.label("data") not in xs and F.label("optcnn") in xs
    notes = [an for an in fig.layout.annotations if an.x == F.label("data")]
    assert len(notes) == 1 and "infeasible" in notes[0].text
    assert "divisible by 4" in notes[0].text.replace("<br>", " ")
    # the category axis still lists all five strategies
    assert len(fig.layout.xaxis.categoryarray) == 5
    assert any("infeasible" in an.text for an in F.bytes_figure(res).layout.annotations)


def test_bytes_figure(results):
    fig = F.bytes_figure(results)
    assert [tr.name for tr in fig.data] == ["transfer", "sync"]
    totals = _totals(fig)
    for a in ("data", "model", "owt", "megatron", "optcnn"):
        assert totals[F.label(a)] == pytest.approx(results[a]["comm_bytes"] / 2 ** 20)
    # data parallelism only synchronises parameters, model parallelism only transfers
    sync = dict(zip(fig.data[1].x, fig.data[1].y))
    xfer = dict(zip(fig.data[0].x, fig.data[0].y))
    assert xfer[F.label("data")] == 0 and sync[F.label("data")] > 0
    assert sync[F.label("model")] == 0 and xfer[F.label("model")] > 0


def test_scaling_figure():
    scal = session.scaling(session.Request(batch=16, **REQ))
    fig = F.scaling_figure(scal)
    names = [tr.name for tr in fig.data]
    assert names[-1] == "linear ideal"
    assert fig.data[-1].line.dash == "dash" and fig.data[-1].line.color == F.IDEAL_COLOR
    assert names[:5] == [F.label(a, " ") for a in ("data", "model", "owt", "megatron", "optcnn")]
    for tr in fig.data:
        assert list(tr.x) == [1, 2, 4]
    assert list(fig.data[-1].y) == pytest.approx(scal["ideal"])


def test_scaling_figure_gaps_for_infeasible():
    scal = {"devices": [1, 2, 4], "data": [10.0, None, 35.0], "optcnn": [10.0, 19.0, 38.0],
            "ideal": [10.0, 20.0, 40.0]}
    fig = F.scaling_figure(scal)
    assert "infeasible at 2" in fig.data[0].name
    assert fig.data[0].y[1] is None and fig.data[0].connectgaps is False


def test_run_compare_uses_pins_and_caches_scaling(monkeypatch):
    req = session.Request(batch=16, **REQ)
    calls = []
    real = session.scaling
    monkeypatch.setattr(session, "scaling", lambda r: calls.append(r) or real(r))
    C._SCALING.clear()
    plain = C.run_compare(req, [])
    pinned = C.run_compare(req, ["conv1=n=1,c=1@0"])
    assert len(calls) == 1  # pins do not recompute scaling
    assert "1 pin" in pinned["status"] and "pin" not in plain["status"]
    assert pinned["results"]["optcnn"]["pins"] == ["conv1=n=1,c=1@0"]
    assert C.shown_key(pinned["time"].to_plotly_json()) == C.compare_key(req, ["conv1=n=1,c=1@0"])


def test_request_for_prefers_plan_request():
    plan = {"layers": [], "request": session.Request(batch=8, **REQ).to_dict()}
    assert C.request_for(plan, {"model": "vgg16"}).batch == 8
    assert C.request_for({"error": "x"}, {"model": "vgg16"}).model == "vgg16"
