"""Plans panel logic: upload parsing, download payload, auto-save, loading from history."""

import base64
import json

import pytest

from explorer import service as session
from explorer.engine.core.history import PlanStore
from explorer.engine.layerwise.plan import Plan
from explorer.views import plans as P

REQ = session.Request(model="lenet5", preset="p100-cluster", devices=4, batch=16)


@pytest.fixture(scope="module")
def plan():
    return session.search(REQ, [])


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path / "home"))
    return PlanStore()


def _as_saved(obj):
    """A plan document as the tool saves it (sealed); anything else unchanged."""
    from explorer.engine.core.plandoc import kind_of, seal
    if isinstance(obj, dict) and obj.get("version") == 2 and "checksum" not in obj \
            and kind_of(obj):
        return seal(obj, kind_of(obj))
    return obj


def _upload(obj_or_text) -> str:
    obj_or_text = _as_saved(obj_or_text)
    text = obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text)
    return "data:application/json;base64," + base64.b64encode(text.encode()).decode()


def test_upload_accepts_real_plan(plan):
    saved = P.download_payload(plan)["content"]
    doc = P.parse_upload(_upload(saved), "p.json")
    assert doc["model"] == "lenet5" and len(doc["layers"]) == len(plan["layers"])
    with pytest.raises(ValueError, match="edited after it was saved"):
        P.parse_upload(_upload(saved.replace('"lenet5"', '"alexnet"', 1)), "p.json")


@pytest.mark.parametrize("payload, message", [
    ("{not json", "not valid JSON"),
    ([1, 2, 3], "JSON list, not a plan object"),
    ({"schema": "something/else@3", "layers": []}, "not a plan file: schema"),
    ({"error": "no plan"}, "failed search"),
])
def test_upload_rejects_bad_files(payload, message):
    with pytest.raises(ValueError, match=message):
        P.parse_upload(_upload(payload), "bad.json")


def test_upload_rejects_missing_field(plan):
    from explorer.engine.core.plandoc import seal
    doc = seal({k: v for k, v in plan.items() if k != "objective_s"}, "layerwise")
    with pytest.raises(ValueError, match="missing or bad field 'objective_s'"):
        P.parse_upload(_upload(doc), "p.json")


def test_upload_rejects_binary():
    contents = "data:application/octet-stream;base64," + base64.b64encode(b"\xff\xfe\x00").decode()
    with pytest.raises(ValueError, match="not a JSON text file"):
        P.parse_upload(contents, "x.bin")


def test_download_round_trips(plan):
    data = P.download_payload(dict(plan, history_id=7))
    assert data["filename"] == "lenet5-optcnn-4dev.json"
    doc = json.loads(data["content"])
    assert "trace" not in doc and "history_id" not in doc
    p = Plan.from_dict(doc)
    assert p.objective_s == pytest.approx(plan["objective_s"])
    assert [la.name for la in p.layers] == [la["name"] for la in plan["layers"]]
    with pytest.raises(ValueError, match="failed"):
        P.download_payload({"error": "infeasible"})
    with pytest.raises(ValueError, match="no plan"):
        P.download_payload(None)


def test_autosave_skips_history_id_errors_and_duplicates(plan, store):
    assert P.autosave({"error": "x"}, store) == (None, None)
    assert P.autosave(None, store) == (None, None)
    assert P.autosave(dict(plan, history_id=1), store) == (None, None)
    assert len(store) == 0
    pid, msg = P.autosave(plan, store)
    assert pid is not None and f"#{pid}" in msg and len(store) == 1
    # the same plan found again (new timings) is not saved twice
    again, msg = P.autosave(dict(plan, search_time_s=123.0), store)
    assert again == pid and "already saved" in msg and len(store) == 1


def test_load_plan_sets_history_id_request_and_pins(plan, store):
    pid = store.save(dict(plan, pins=[]))
    loaded, request, pins = P.load_plan(store, pid)
    assert loaded["history_id"] == pid and pins == []
    assert session.Request.from_dict(request) == REQ
    assert P.autosave(loaded, store) == (None, None)  # loading does not re-save
    rows = P.table_rows(store)
    assert rows[0]["id"] == pid and rows[0]["model"] == "lenet5"
    with pytest.raises(KeyError):
        P.load_plan(store, pid + 1)


def test_request_rebuilt_for_cli_plans(plan):
    cli = {k: v for k, v in plan.items() if k not in ("request", "trace")}
    assert session.Request.from_dict(P.request_of(cli)) == REQ


def test_ingest_upload_saves_and_loads(plan, store):
    cli = {k: v for k, v in plan.items() if k not in ("request", "trace")}
    loaded, request, pins, msg = P.ingest_upload(_upload(cli), "mine.json", store)
    assert loaded["history_id"] == 1 and "saved as plan #1" in msg
    assert request["model"] == "lenet5" and pins == []
    assert store.list()[0]["note"] == "uploaded mine.json"
    # uploading it again loads the saved one instead of duplicating it
    loaded2, _, _, msg2 = P.ingest_upload(_upload(cli), "mine.json", store)
    assert loaded2["history_id"] == 1 and "same plan" in msg2 and len(store) == 1


def test_ingest_upload_rejects_plan_of_other_model(plan, store):
    doc = {k: v for k, v in plan.items() if k != "request"}
    doc["layers"] = [dict(la, name="x_" + la["name"]) for la in plan["layers"]]
    with pytest.raises(ValueError, match="does not match model 'lenet5'"):
        P.ingest_upload(_upload(doc), "other.json", store)
    assert len(store) == 0
