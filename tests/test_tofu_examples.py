"""Every built-in example model's Tofu plan and its baselines' (allrow-greedy, equalchop,
icml18) run on 2 gloo workers against the float64 single-device step, and the bytes the
workers move equal the plan's prediction.  On 4 workers (two levels of Tofu's recursion) the
Tofu plan and the equal-chop baseline of every model run: the recursion and the tiles of a
second level are the same code for every method, and 4 workers on 2 cores cost the most.

Plans are searched here and saved as documents; the runtime executes the documents and never
searches.  The plans of one worker count run in one launch
(:func:`explorer.engine.runtime.dispatch.run_tofu_documents`: the processes start once, each model
is built once); when that launch fails, each model's plans run in a launch of their own, and
a failing model's plans one by one, so the failing test names its model, method and worker
count without rerunning every plan alone.  The models are at small sizes (``SIZES``).
"""

from __future__ import annotations

import pytest

import example_models
from explorer.engine.runtime.dispatch import run_tofu_documents
from explorer.engine.search import Problem, Request, run

pytestmark = pytest.mark.multiprocess   # every test here starts worker processes

#: the example models at sizes that run on 2 cores in seconds (arguments as ``-a KEY=VALUE``)
SIZES = example_models.SMALL
ALGOS = ["tofu", "allrow-greedy", "equalchop", "icml18"]
#: worker count -> the methods run at it
WORKERS = {2: ALGOS, 4: ["tofu", "equalchop"]}
BATCH = 2
CASES = [(m, a, k) for k, algos in WORKERS.items() for m in SIZES for a in algos]


def test_every_example_model_is_sized_here():
    assert set(SIZES) == set(example_models.MODELS)


def _doc(name, algo, k) -> dict:
    """The saved plan (what `explorer search NAME --algo ALGO --devices K --out` writes)."""
    return run(algo, Problem(Request(name, BATCH, dict(SIZES[name]), preset="local", devices=k))).document()


def _run(docs) -> list:
    return run_tofu_documents(docs, steps=1, timeout_s=1800)


class _Runs:
    """(model, algo, workers) -> the run's result, or the exception that stopped it.  The
    plans of one worker count are searched and run in one launch when the first of their
    tests asks, and only the cases this session selected: under pytest-xdist the two worker
    counts are two units of work (``xdist_group`` below), each launching only its own."""

    def __init__(self, session):
        self.wanted = {tuple(it.callspec.params[p] for p in ("name", "algo", "workers"))
                       for it in session.items
                       if getattr(it, "originalname", "") == "test_example_plan_runs_as_predicted"}
        self.out: dict = {}
        self.launched: set = set()

    def __getitem__(self, case):
        k = case[2]
        if k not in self.launched:
            self.launched.add(k)
            self._launch(k)
        return self.out[case]

    def _launch(self, k):
        docs = {}
        for case in (c for c in CASES if c in self.wanted and c[2] == k):
            try:
                docs[case] = _doc(*case)
            except Exception as exc:  # noqa: BLE001 - reported by the case's test
                self.out[case] = exc
        if not docs:
            return
        self._run_or_split(docs, by_model=True)

    def _run_or_split(self, docs: dict, by_model: bool):
        """Run ``docs`` in one launch; when it fails, per model (``by_model``), then alone."""
        try:
            self.out.update(zip(docs, _run(list(docs.values()))))
            return
        except Exception as exc:  # noqa: BLE001 - split: the failure names its plan
            if len(docs) == 1:
                self.out[next(iter(docs))] = exc
                return
        if by_model:
            for model in dict.fromkeys(case[0] for case in docs):
                self._run_or_split({c: d for c, d in docs.items() if c[0] == model}, False)
        else:
            for case, doc in docs.items():
                self._run_or_split({case: doc}, False)


@pytest.fixture(scope="module")
def runs(request):
    return _Runs(request.session)


@pytest.mark.parametrize("name,algo,workers", [
    pytest.param(m, a, k, id=f"{m}-{a}-{k}",
                 marks=pytest.mark.xdist_group(f"tests/test_tofu_examples.py-{k}-workers"))
    for m, a, k in CASES])
def test_example_plan_runs_as_predicted(runs, name, algo, workers):
    r = runs[(name, algo, workers)]
    if isinstance(r, BaseException):
        raise r
    assert r["algo"] == algo and r["devices"] == workers and r["workers"] == workers
    # the loss and every updated parameter against the float64 single-device step
    assert r["reference_ok"], (r["max_rel_error"], r["reference"].get("worst_param"))
    # float64: a wrong region or reduction errs by O(1); rounding stays far below 1e-6 (BatchNorm
    # over two values, as ResNet's last stage at this size, amplifies it to ~1e-8)
    assert r["max_rel_error"] < 1e-6, r["reference"].get("worst_param")
    assert r["reference"]["params_compared"] > 0 and not r["reference"]["problems"]
    # every byte the workers exchanged in the step is one the plan's cost accounting predicted
    assert r["measured_comm_bytes"] == pytest.approx(r["predicted_comm_bytes"], rel=1e-12)
    assert r["predicted_comm_bytes"] > 0
    # the operators still computed on full-size buffers are listed with a reason
    assert set(r["fallback_reasons"]) == set(r["fallback_ops"])
