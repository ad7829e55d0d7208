"""One app state: the request every tab operates on, the URL that carries it, and the gate
that keeps model files off a shared server.

The request store (``ids.STORE_REQUEST``) holds one dict: :class:`explorer.service.Request`'s
fields (model, batch, model args, device preset and count, method) plus ``pins``.  The form
writes it, loading a plan writes the form, the URL is rewritten from it, and every tab reads
it.  Whatever reaches the server from the page becomes a request through :func:`request`,
which refuses ``path.py:function`` models unless the server allows model files.

The policy is process-wide (:func:`allow_model_files`): Dash runs background callbacks in
processes forked from the server, and registers them per process, not per app.
"""

from __future__ import annotations

from urllib.parse import urlencode

from explorer import service as session
from explorer.errors import ExplorerError, ModelFilesOff

#: what the app opens on: VGG-16 on the paper's 4×P100 NVLink node with its optimal plan
DEFAULT_REQUEST = session.Request(model="vgg16", preset="p100-nvlink-4", devices=4,
                                  algo="optcnn")

FAMILIES = ("layerwise", "tofu", "placement")
FAMILY_LABELS = {"layerwise": "layer-wise", "tofu": "tensor partitioning",
                 "placement": "device placement"}
#: the method a tab uses when the request names a method of another family
DEFAULT_METHOD = {"layerwise": "optcnn", "tofu": "tofu", "placement": "celeritas"}
#: which family of result each tab shows (the Plans tab shows none: it loads into the form)
TAB_FAMILY = {"plan": "layerwise", "steps": "layerwise", "tiling": "layerwise",
              "compare": "layerwise", "run": "layerwise", "tofu": "tofu",
              "placement": "placement"}


def methods() -> dict:
    """Every method the app offers: name -> (family, description), families in order."""
    from explorer import service
    return {k: (fam, v) for fam in ("layerwise", "tofu", "placement")
            for k, v in service.methods(fam).items()}


def family(algo: str | None) -> str | None:
    """``"layerwise"``, ``"tofu"`` or ``"placement"`` (``None``: not a method)."""
    got = methods().get(algo or "")
    return got[0] if got else None


def method_options() -> list:
    """Options of the form's method dropdown, grouped by family."""
    return [{"label": f"{FAMILY_LABELS[fam]} · {k}", "value": k, "title": desc}
            for k, (fam, desc) in methods().items()]


def family_options(fam: str) -> list:
    """Options of a tab's own method dropdown (the methods of one family)."""
    return [{"label": f"{k}: {desc}", "value": k}
            for k, (f, desc) in methods().items() if f == fam]


# -- model files ------------------------------------------------------------------------------

_POLICY = {"model_files": False}


def allow_model_files(allowed: bool) -> None:
    """Let the page load ``path.py:function`` models (``explorer serve --allow-model-files``)."""
    _POLICY["model_files"] = bool(allowed)


def model_files_allowed() -> bool:
    return _POLICY["model_files"]


def is_model_file(spec: str | None) -> bool:
    """Whether ``spec`` names a model file (``path.py:function``) rather than an example or
    ``hf:NAME`` (an installed Transformers architecture, which runs no code from a file)."""
    import example_models as ex
    spec = (spec or "").strip()
    return spec not in ex.MODELS and ":" in spec and not spec.startswith("hf:")


def check_model(spec: str | None) -> None:
    """Refuse a model file unless the server allows them (:class:`ModelFilesOff`)."""
    if is_model_file(spec) and not model_files_allowed():
        raise ModelFilesOff(
            f"model files are off on this server: {spec!r} would run code from a file on the "
            f"server; choose a built-in example, or start the server with "
            f"`explorer serve --allow-model-files` to load path.py:function models")


def request(doc: dict | None) -> session.Request:
    """The :class:`session.Request` of a request dict from the page, checked against the
    model-file policy (``ValueError`` / :class:`ExplorerError` with a message)."""
    req = session.Request.from_dict(doc)
    check_model(req.model)
    return req


def request_doc(req: session.Request, pins: list | None = None) -> dict:
    """The request store's dict: the request's fields and its layer-wise ``pins``."""
    return dict(req.to_dict(), pins=list(pins or []))


def pins_of(doc: dict | None) -> list:
    return list((doc or {}).get("pins") or [])


def same_graph(a: dict | None, b: dict | None) -> bool:
    """Whether two request dicts name the same model graph (model, batch, model args)."""
    if not a or not b:
        return False
    return (a.get("model"), a.get("batch"), sorted((a.get("model_args") or {}).items())) == \
        (b.get("model"), b.get("batch"), sorted((b.get("model_args") or {}).items()))


def same_target(a: dict | None, b: dict | None) -> bool:
    """Same graph on the same devices (preset and count): pins stay meaningful."""
    return same_graph(a, b) and (a.get("preset"), a.get("devices")) == \
        (b.get("preset"), b.get("devices"))


# -- the URL ----------------------------------------------------------------------------------

#: the layer-wise page's view a URL keeps beside the request: the tab shown, the selected
#: layer, the elimination step (1-based, while the Steps tab is shown)
VIEW_TABS = ("plan", "steps", "tiling", "compare", "run")


def view_items(view: dict | None) -> list:
    """The query items of a page's view: ``tab`` (when not the first), ``layer``, ``step``
    (only with the Steps tab)."""
    view = view or {}
    items = []
    tab = view.get("tab")
    if tab in VIEW_TABS and tab != VIEW_TABS[0]:
        items.append(("tab", tab))
    if view.get("layer"):
        items.append(("layer", str(view["layer"])))
    if tab == "steps" and isinstance(view.get("step"), int) and view["step"] >= 1:
        items.append(("step", view["step"]))
    return items


def view_from_query(params: dict | None) -> dict:
    """``{"tab", "layer", "step"}`` from a page's query parameters: what a shared link or a
    reload shows besides the request (a value that makes no sense is left out: the first
    tab, no selection, no step)."""
    given = {k: _one(v) for k, v in (params or {}).items() if v not in (None, "", [])}
    tab = given.get("tab")
    step = given.get("step")
    try:
        step = int(step) if step is not None else None
    except ValueError:
        step = None
    return {"tab": tab if tab in VIEW_TABS else VIEW_TABS[0],
            "layer": given.get("layer") or None,
            "step": step if step is not None and step >= 1 else None}


def query_string(doc: dict | None, view: dict | None = None) -> str:
    """``?model=vgg16&devices=4&preset=p100-nvlink-4&algo=optcnn[&batch=B][&arg=K=V][&pin=P]``
    for a request dict (an uploaded custom cluster cannot travel in a URL), then the page's
    ``view`` (:func:`view_items`: tab, selected layer, elimination step)."""
    if not doc:
        return ""
    items = [("model", doc.get("model", "")), ("devices", doc.get("devices", "")),
             ("preset", doc.get("preset", "")), ("algo", doc.get("algo", ""))]
    if doc.get("batch") is not None:
        items.append(("batch", doc["batch"]))
    items += [("arg", f"{k}={v}") for k, v in (doc.get("model_args") or {}).items()]
    items += [("pin", p) for p in pins_of(doc)]
    items += view_items(view)
    return "?" + urlencode(items)


#: the path of each page that shows a request: one per method family, and the Plans page
PAGE_PATHS = {"layerwise": "/", "tofu": "/tofu", "placement": "/placement", "plans": "/plans"}


def page_url(page: str, doc: dict | None) -> str:
    """The address of ``page`` ("layerwise", "tofu", "placement", "plans") opened on request
    ``doc``."""
    return PAGE_PATHS[page] + query_string(doc)


def _many(v) -> list:
    if v is None:
        return []
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)]


def _one(v):
    return _many(v)[-1] if _many(v) else None


def from_query(params: dict, default: dict) -> tuple[dict, list]:
    """``(request dict, errors)`` for the page's query parameters (Dash pages passes them as a
    dict; repeated ones as lists).  A bad parameter keeps ``default``'s value and adds a
    one-line error; the model-file policy is checked too."""
    doc = dict(default)
    doc.setdefault("pins", [])
    errors = []
    given = {k: v for k, v in (params or {}).items() if v not in (None, "", [])}
    if "model" in given:
        spec = _one(given["model"]).strip()
        try:
            check_model(spec)
            if spec != doc.get("model"):       # another model: its own batch and arguments
                doc.update(model=spec, batch=None, model_args={})
        except ExplorerError as exc:
            errors.append(str(exc))
    for key, label in (("devices", "devices"), ("batch", "batch")):
        if key in given:
            raw = _one(given[key])
            try:
                val = int(raw)
                if val < 1:
                    raise ValueError
                doc[key] = val
            except ValueError:
                errors.append(f"URL: {label}={raw!r} is not a whole number ≥ 1")
    if "preset" in given:
        from explorer.engine.core.devices import list_presets
        name = _one(given["preset"])
        names = [p["name"] for p in list_presets()]
        if name in names:
            doc["preset"] = name
        else:
            errors.append(f"URL: unknown preset {name!r}: one of {', '.join(names)}")
    if "algo" in given:
        name = _one(given["algo"])
        if family(name):
            doc["algo"] = name
        else:
            errors.append(f"URL: unknown method {name!r}: one of {', '.join(methods())}")
    if "arg" in given:
        try:
            doc["model_args"] = session.parse_model_args(",".join(_many(given["arg"])))
        except ValueError as exc:
            errors.append(f"URL: {exc}")
    doc["pins"] = _many(given.get("pin"))
    if doc.get("preset") != "custom":
        doc["cluster"] = None
    return doc, errors


# -- plan documents ---------------------------------------------------------------------------

def request_from_document(doc: dict, kind: str) -> dict:
    """The request dict (with pins) a plan document answers, from its own ``request`` when the
    app saved it, else from its fields: layer-wise plans name ``preset`` and ``devices``; Tofu
    plans ``devices`` (the workers) and ``preset``; placements name the preset in ``devices``
    and the count in ``n_devices`` (or as many devices as ``capacity_bytes``).  Raises
    ``ValueError`` when the document does not say enough."""
    if doc.get("request"):
        req = session.Request.from_dict(doc["request"])
    else:
        dev = doc.get("devices")
        preset = doc.get("preset") if isinstance(doc.get("preset"), str) else None
        if preset is None and isinstance(dev, str):
            preset = dev
        count = doc.get("n_devices")
        if count is None and isinstance(dev, int) and not isinstance(dev, bool):
            count = dev
        if count is None and doc.get("capacity_bytes"):
            count = len(doc["capacity_bytes"])
        if not preset or count is None:
            raise ValueError("the document names no device preset and count")
        info = doc.get("info") or {}
        req = session.Request(model=doc.get("spec") or doc["model"], batch=doc.get("batch"),
                              model_args={str(k): str(v) for k, v in
                                          (doc.get("model_args") or {}).items()},
                              preset=preset, devices=int(count),
                              algo=doc.get("algo") or DEFAULT_METHOD[kind],
                              cost=info.get("compute_cost", "analytic"),
                              sync=info.get("sync", "ps"))
    if family(req.algo) != kind:
        req.algo = doc.get("algo") if family(doc.get("algo")) == kind else DEFAULT_METHOD[kind]
    pins = doc.get("pins") if kind == "layerwise" else None
    return request_doc(req, [str(p) for p in pins or []])


# -- what a tab operates on -------------------------------------------------------------------

def describe(doc: dict | None, method: str | None = None) -> str:
    """``"lenet5 · batch 8 · 2 × local · optcnn"`` for a request dict."""
    if not doc:
        return "nothing yet"
    args = ", ".join(f"{k}={v}" for k, v in (doc.get("model_args") or {}).items())
    batch = doc.get("batch")
    return (f"{doc.get('model')}{f' ({args})' if args else ''} · "
            f"batch {batch if batch is not None else 'default'} · "
            f"{doc.get('devices')} × {doc.get('preset')} · {method or doc.get('algo')}")


def tab_method(tab: str, doc: dict | None, tab_algo: str | None = None) -> str | None:
    """The method ``tab`` runs for request ``doc``: the request's own when it belongs to the
    tab's family, else the tab's own choice (``tab_algo``) or the family's default."""
    fam = TAB_FAMILY.get(tab)
    algo = (doc or {}).get("algo")
    if fam is None or family(algo) == fam:
        return algo
    return tab_algo if family(tab_algo) == fam else DEFAULT_METHOD[fam]


def context_line(tab: str, doc: dict | None, shown: dict | None,
                 tab_algo: str | None = None) -> str:
    """The one line a tab shows: what it operates on, and what it shows when that differs
    (a result made before the form changed)."""
    method = tab_method(tab, doc, tab_algo)
    line = f"Operates on: {describe(doc, method)}"
    if TAB_FAMILY.get(tab) is None:
        return line + " · loading a plan puts its model, devices and method in the form"
    if not shown or "error" in shown:
        return line
    req = shown.get("request")
    algo = shown.get("algo")
    if req and not (same_target(req, doc) and algo == method):
        line += f" · showing {describe(req, algo)}: press Search to update"
    return line


def stale_note(tab: str, doc: dict | None, shown: dict | None,
               tab_algo: str | None = None) -> str:
    """The warning a page shows over results made for another request than the form's
    (``""`` when they match, or when nothing is shown): the form changed (another model,
    batch, devices or method) and Search has not run yet, so what is on screen - graph,
    pins, objective - no longer answers the form."""
    if not shown or "error" in shown or not shown.get("request") or not doc:
        return ""
    method = tab_method(tab, doc, tab_algo)
    req, algo = shown["request"], shown.get("algo")
    if same_target(req, doc) and algo == method:
        return ""
    return (f"These results are for {describe(req, algo)}, not the form "
            f"({describe(doc, method)}): press Search to update them.")


# -- the form ---------------------------------------------------------------------------------

def form_values(doc: dict) -> dict:
    """The model panel's control values for a request dict."""
    import example_models as ex
    spec = doc.get("model") or ""
    example = spec in ex.MODELS
    return {"model": spec if example else None, "model_file": "" if example else spec,
            "batch": doc.get("batch"),
            "args": ", ".join(f"{k}={v}" for k, v in (doc.get("model_args") or {}).items()),
            "preset": doc.get("preset"), "devices": doc.get("devices"),
            "algo": doc.get("algo")}


__all__ = ["FAMILIES", "TAB_FAMILY", "DEFAULT_METHOD", "methods", "family", "method_options",
           "family_options", "allow_model_files", "model_files_allowed", "is_model_file",
           "check_model", "request", "request_doc", "pins_of", "same_graph", "same_target",
           "query_string", "VIEW_TABS", "view_items", "view_from_query", "PAGE_PATHS", "page_url", "from_query", "request_from_document", "describe", "tab_method",
           "context_line", "stale_note", "form_values"]
