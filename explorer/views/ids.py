"""Every component id of the app in one place (views import these, never spell ids inline)."""

# the shell (explorer/app.py): what every page shares
SHARED_REQUEST = "shared-request"    # the request of the page shown last (the nav links and
                                     # the address bar follow it across pages)
STORE_LOADED = "store-loaded"        # {"kind", "doc", "request"}: a plan the Plans page
                                     # loaded, adopted by the page of its family (kept in the
                                     # browser's session storage across that page's load)
NAVIGATE_SYNC = "navigate-sync"      # dummy output of the clientside page opener
NAV_LINK = "nav-"                    # + page key ("layerwise", "tofu", ...): a header link
URL_QUERY = "url-query"              # the query string of the request (mirrored into the URL)
URL_SYNC = "url-sync"                # dummy output of the clientside URL writer

# each page's own stores (created by its page module)
PAGE_FAMILY = "page-family"          # which family's page this is ("layerwise", "tofu", ...)
STORE_REQUEST = "store-request"      # THE page's request: model, batch, args, preset, devices,
                                     # method (algo) and layer-wise pins ("LAYER=n=2,c=2@0,1")
SAVED = "saved-"                     # + family: the id the page's autosave gave its result
FAMILY_HINT = "family-hint"          # "icml18 is a Tofu method: open the Tofu page"
NAVIGATE = "navigate"                # an address the page's callbacks open (another page)
STORE_FOUND = "store-found"          # {"family", "doc"}: what the form's Search found here
STORE_PLAN = "store-plan"            # current plan dict (+ trace_ref, info, previous objective)
STORE_SEEN = "store-seen"            # the model the page last showed (resets on a change)
CONTEXT = "context-"                 # + tab name: the tab's "operates on" line
STORE_SELECTED = "store-selected"    # selected layer name (or None)
STORE_EXPANDED = "store-expanded"    # list of expanded hierarchy groups
STORE_STEP = "store-step"            # elimination step index shown on the graph (or None)
STORE_VIEW = "store-view"            # {"tab", "layer", "step"}: the view the URL keeps
LEARN_URL_SYNC = "learn-url-sync"    # dummy output of the Learn page's address writer
STALE = "stale-"                     # + family: "these results are for …, not the form"
RESULTS = "results-"                 # + family: the page's results (dimmed while stale)

# model & devices panel
MODEL_DROPDOWN = "model-dropdown"
MODEL_FILE = "model-file"
BATCH_INPUT = "batch-input"
MODEL_ARGS = "model-args"
PRESET_DROPDOWN = "preset-dropdown"
CLUSTER_UPLOAD = "cluster-upload"
DEVICES_INPUT = "devices-input"
ALGO_DROPDOWN = "algo-dropdown"
SEARCH_BUTTON = "search-button"
CANCEL_BUTTON = "cancel-button"
SEARCH_PROGRESS = "search-progress"
SEARCH_STATUS = "search-status"
MODEL_SUMMARY = "model-summary"
REQUEST_ERROR = "request-error"

# graph panel
GRAPH = "graph"
GRAPH_LEGEND = "graph-legend"
GRAPH_INFO = "graph-info"
EXPAND_ALL = "expand-all"
COLLAPSE_ALL = "collapse-all"

# node details / pins
DETAILS = "details"
CANDIDATE_TABLE = "candidate-table"
PIN_CONFIG = "pin-config"
PIN_DEVICES = "pin-devices"
PIN_BUTTON = "pin-button"
UNPIN_BUTTON = "unpin-button"
RERUN_BUTTON = "rerun-button"
PIN_ERROR = "pin-error"
PIN_LIST = "pin-list"
CLEAR_PINS = "clear-pins"

# plan summary
PLAN_SUMMARY = "plan-summary"
PLAN_CHANGES = "plan-changes"
PLAN_EXPORT_BUTTON = "plan-export-button"   # the layer-wise plan as a PyTorch program
PLAN_EXPORT = "plan-export"
PLAN_EXPORT_ERROR = "plan-export-error"
PLAN_EXPORT_PREVIEW = "plan-export-preview"   # "N of M layers as planned", before download

# elimination steps
STEP_SLIDER = "step-slider"
STEP_PREV = "step-prev"
STEP_NEXT = "step-next"
STEP_TEXT = "step-text"
STEP_INPUT = "step-input"            # the step number box (jumps on Enter)
STEP_DOCK = "step-dock"              # the stepper over the graph (shown with the Steps tab)
STEP_SCROLL = "step-scroll"          # dummy output of the clientside scroll to the stepper
STORE_STEP_OPENED = "store-step-opened"  # the groups the stepper opened (closed as it moves)

# tiling
TILING_LAYER = "tiling-layer"
TILING_DEVICE = "tiling-device"
TILING_FIGURE = "tiling-figure"
TILING_STRIP = "tiling-strip"

# compare
COMPARE_BUTTON = "compare-button"
COMPARE_TIME = "compare-time"
COMPARE_BYTES = "compare-bytes"
COMPARE_SCALING = "compare-scaling"
COMPARE_STATUS = "compare-status"
# compare across families (the Compare tab's first section: every family on the form's request)
FAMILIES_BUTTON = "families-button"
FAMILIES_CANCEL = "families-cancel"
FAMILIES_PROGRESS = "families-progress"
FAMILIES_STATUS = "families-status"
FAMILIES_RESULTS = "families-results"    # hidden until the first comparison
FAMILIES_NOTE = "families-note"          # what each family's prediction rests on
FAMILIES_FIG = "families-fig"
FAMILIES_TABLE = "families-table"
FAMILIES_CSV_BUTTON = "families-csv-button"
FAMILIES_CSV = "families-csv"
STORE_FAMILIES = "store-families"      # {"key", "report"}: the last comparison (its request)
# rank by running (the Compare tab's second section: every chosen method's plan run here)
RANK_BUTTON = "rank-button"
RANK_CANCEL = "rank-cancel"
RANK_PROGRESS = "rank-progress"
RANK_STATUS = "rank-status"
RANK_ROUNDS = "rank-rounds"
RANK_STEPS = "rank-steps"
RANK_METHODS = "rank-methods-"          # + family: the methods of that family to rank
RANK_GATE = "rank-gate"                 # why the button is off (the preset is not local)
RANK_ERROR = "rank-error"               # bad input or a ranking that failed, in one line
RANK_RESULTS = "rank-results"           # hidden until the first ranking
RANK_SUMMARY = "rank-summary"           # tau, regret, the noise seen
RANK_FIG = "rank-fig"
RANK_TABLE = "rank-table"
RANK_CSV_BUTTON = "rank-csv-button"
RANK_CSV = "rank-csv"

# plans (history)
PLANS_TABLE = "plans-table"
PLANS_REFRESH = "plans-refresh"
PLAN_LOAD = "plan-load"
PLAN_DOWNLOAD_BUTTON = "plan-download-button"
PLAN_DOWNLOAD = "plan-download"
PLAN_UPLOAD = "plan-upload"
PLANS_STATUS = "plans-status"

TABS = "tabs"

# run (execute the plan on local devices)
RUN_STEPS = "run-steps"
RUN_WARMUP = "run-warmup"
RUN_BUTTON = "run-button"
RUN_CANCEL = "run-cancel"
RUN_PROGRESS = "run-progress"
RUN_STATUS = "run-status"
RUN_ERROR = "run-error"
RUN_RESULT = "run-result"
RUN_LAYERS = "run-layers"
RUN_SERIES = "run-series"
RUN_HISTORY = "run-history"
STORE_RUN = "store-run"

# tofu (partition every tensor of the training step)
TOFU_ALGO = "tofu-algo"
TOFU_BUTTON = "tofu-button"
TOFU_CANCEL = "tofu-cancel"
TOFU_PROGRESS = "tofu-progress"
TOFU_STATUS = "tofu-status"
TOFU_ERROR = "tofu-error"
TOFU_SUMMARY = "tofu-summary"
TOFU_STEPS = "tofu-steps"
TOFU_STEP = "tofu-step"
TOFU_STRIP = "tofu-strip"
TOFU_COMPARE_BUTTON = "tofu-compare-button"
TOFU_COMPARE = "tofu-compare"
TOFU_DOWNLOAD_BUTTON = "tofu-download-button"
TOFU_DOWNLOAD = "tofu-download"
STORE_TOFU = "store-tofu"
TOFU_RUN_BUTTON = "tofu-run-button"
TOFU_RUN_CANCEL = "tofu-run-cancel"
TOFU_RUN_PROGRESS = "tofu-run-progress"
TOFU_RUN_STATUS = "tofu-run-status"
TOFU_RUN_MEMORY = "tofu-run-memory"             # --memory-per-worker (GiB), optional
TOFU_RUN_ERROR = "tofu-run-error"
TOFU_RUN_RESULT = "tofu-run-result"
TOFU_RUN_MEMORY_FIG = "tofu-run-memory-fig"
TOFU_RUN_TIME_FIG = "tofu-run-time-fig"
TOFU_RUN_HISTORY = "tofu-run-history"
STORE_TOFU_RUN = "store-tofu-run"               # last run of a Tofu plan (panel)

# placement (Celeritas device placement of the operator graph, and its baselines)
PLACE_ALGO = "place-algo"
PLACE_MEMORY = "place-memory"
PLACE_BUTTON = "place-button"
PLACE_DOWNLOAD_BUTTON = "place-download-button"
PLACE_DOWNLOAD = "place-download"
PLACE_CANCEL = "place-cancel"
PLACE_PROGRESS = "place-progress"
PLACE_STATUS = "place-status"
PLACE_ERROR = "place-error"
PLACE_SUMMARY = "place-summary"
PLACE_GRAPH = "place-graph"
PLACE_GRAPH_INFO = "place-graph-info"
PLACE_COLLAPSE = "place-collapse"
PLACE_LEGEND = "place-legend"
PLACE_DETAILS = "place-details"
PLACE_PIN_DEVICE = "place-pin-device"
PLACE_PIN_BUTTON = "place-pin-button"
PLACE_CLEAR_PINS = "place-clear-pins"
PLACE_PIN_ERROR = "place-pin-error"
PLACE_PIN_LIST = "place-pin-list"
PLACE_UNPIN = "place-unpin"            # pattern-matching type: {"type": PLACE_UNPIN, "index": i}
PLACE_GANTT = "place-gantt"
PLACE_MEMORY_FIG = "place-memory-fig"
PLACE_COMPARE_BUTTON = "place-compare-button"
PLACE_COMPARE_CANCEL = "place-compare-cancel"
PLACE_COMPARE_PROGRESS = "place-compare-progress"
PLACE_COMPARE_STATUS = "place-compare-status"
PLACE_COMPARE_TABLE = "place-compare-table"
PLACE_COMPARE_FIG = "place-compare-fig"
PLACE_RUN_BUTTON = "place-run-button"
PLACE_RUN_CANCEL = "place-run-cancel"
PLACE_RUN_STEPS = "place-run-steps"
PLACE_RUN_PROGRESS = "place-run-progress"
PLACE_RUN_STATUS = "place-run-status"
PLACE_RUN_ERROR = "place-run-error"
PLACE_RUN_RESULT = "place-run-result"
PLACE_RUN_FIG = "place-run-fig"
PLACE_RUN_SERIES = "place-run-series"
PLACE_RUN_HISTORY = "place-run-history"
STORE_PLACE_RUN = "store-place-run"              # last run_placement result (panel)
STORE_PLACEMENT = "store-placement"              # current placement doc (page)
STORE_PLACE_PINS = "store-place-pins"            # [{"target", "ops", "device"}] (panel)
STORE_PLACE_SELECTED = "store-place-selected"    # {"kind": "cluster"|"op", ...} (panel)
STORE_PLACE_EXPANDED = "store-place-expanded"    # expanded cluster index or None (panel)

# -- explanations, CSV downloads, calibration ----------------------------------------------------
STEP_LEGEND = "step-legend"                      # what each highlight colour of a step means
STEP_EQUATIONS = "step-equations"                # equations 1-3 with the current step's numbers
CANDIDATE_CSV_BUTTON = "candidate-csv-button"
CANDIDATE_CSV = "candidate-csv"
PLAN_CSV_BUTTON = "plan-csv-button"              # the plan's per-layer table as CSV
PLAN_CSV = "plan-csv"
PLAN_TABLE = "plan-table"
TOFU_CSV_BUTTON = "tofu-csv-button"
TOFU_CSV = "tofu-csv"
PLACE_CSV_BUTTON = "place-csv-button"
PLACE_CSV = "place-csv"
PLANS_CSV_BUTTON = "plans-csv-button"
PLANS_CSV = "plans-csv"
RUN_COST_MODEL = "run-cost-model"                # which cost model made the prediction
CALIB_BUTTON = "calib-button"
CALIB_CANCEL = "calib-cancel"
CALIB_PROGRESS = "calib-progress"
CALIB_STATUS = "calib-status"
CALIB_ERROR = "calib-error"
RUN_FIGURES = "run-figures"                      # the run's charts, hidden before a run

# Learn page (/learn): the papers' figures as live scenarios
LEARN_TABS = "learn-tabs"                  # which scenario is shown (value = scenario key)
LEARN_BODY = "learn-body"                  # the shown scenario's content (built on demand)
LEARN_TOUR = "learn-tour"                  # the guided tour overlay
LEARN_TOUR_OPEN = "learn-tour-open"        # header button: take the tour again
LEARN_TOUR_NEXT = "learn-tour-next"
LEARN_TOUR_BACK = "learn-tour-back"
LEARN_TOUR_CLOSE = "learn-tour-close"
LEARN_TOUR_STEP = "learn-tour-step"        # the tour's text for the current step
STORE_LEARN_TOUR = "store-learn-tour"      # {"seen": bool} in localStorage: first visit or not
STORE_LEARN_STEP = "store-learn-step"      # the tour's current step index (or None: closed)


def learn(scenario: str, part: str) -> str:
    """The id of one part (``fig``, ``paper``, ``ours``, ``link``, a control name) of a Learn
    scenario: ``learn-<scenario>-<part>``."""
    return f"learn-{scenario}-{part}"
