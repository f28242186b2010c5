"""What the chapters read from a stored experiment: tables, sweeps, fits.

Every function takes the result dict of :func:`~fvlib.experiments.storage.load_result` (version 2,
:mod:`fvlib.experiments.records`) and computes nothing but summaries of its numbers:
:func:`summarise` and :func:`point_rows` (one row per point), :func:`depth_sweep_of`,
:func:`theory_curves`, :func:`decay_fits`, :func:`sweep_table_rows`, :func:`attempt_loss`,
:func:`controls_rows` (the controls experiments: each point against model B and the references),
:func:`controls_panels` (their headline figure's curves).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..stats import independent_ratio, seed_mean, seed_mean_stderr
from ..theory.fits import fit_decay
from .definitions import CONTROL_VARIANTS, run_key
from .inbuild import DepthSweep
from .rules import doubling_gain, failed, last_fifth_drop, point_of

__all__ = ["CONTROL_CURVES", "CONTROL_REFERENCES", "attempt_loss", "controls_panels", "controls_rows",
           "decay_fits", "depth_sweep_of", "point_rows",
           "summarise", "sweep_table_rows", "theory_curves"]

def _records_by_point(data: dict) -> dict[tuple, list[dict]]:
    """The stored runs grouped by point (variant, prior, budget), each group in seed order."""
    points: dict[tuple, list[dict]] = {}
    for record in data["runs"].values():
        points.setdefault(point_of(record), []).append(record)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in points.items()}


def summarise(data: dict) -> list[dict]:
    """One row per point (variant, prior, budget) of a result: the seeds' final losses
    (``loss``, in seed order) with their Monte Carlo standard errors (``loss_stderr``), their
    mean, Monte Carlo standard error of the mean, spread (std over seeds, ``ddof=1``), the
    number of runs converged (``converged``, by the file's rule) and not converged, the steps,
    and the paired ratio to greedy (tree runs: mean over seeds and its spread)."""
    points = _records_by_point(data)
    rows = []
    for (variant, prior, budget), records in points.items():
        loss = np.array([r["final_loss"] for r in records])
        se = np.array([r["final_stderr"] for r in records])
        mean, stderr, spread = (float(v) for v in seed_mean(loss, se))
        row = {"variant": variant, "prior": prior, "budget": budget, "seeds": [r["seed"] for r in records],
               "loss": loss.tolist(), "loss_stderr": se.tolist(), "mean": mean, "stderr": stderr, "spread": spread,
               "converged": int(sum(r["converged"] for r in records)),
               "not_converged": int(sum(not r["converged"] for r in records)),
               "steps": [r["steps"] for r in records]}
        if all(r.get("greedy_paired") is not None for r in records):
            ratios = np.array([r["greedy_paired"]["ratio"] for r in records])
            row["ratio_to_greedy"] = ratios.tolist()
            row["ratio_mean"] = float(ratios.mean())
        rows.append(row)
    return rows


def attempt_loss(record: dict, max_steps: int | None = None) -> tuple[float, float]:
    """A stored run's final loss and its standard error as training ``max_steps`` steps would
    have left it: the loss of its last attempt (the store trains 3000 steps, then 6000, then
    12000 while a run has not converged) with at most ``max_steps`` steps. Only the last
    attempt stores its standard error; an earlier one gets ``nan``. ``None``: the run's
    final loss."""
    if max_steps is None:
        return record["final_loss"], record["final_stderr"]
    kept = [a for a in record["attempts"] if a["steps"] <= max_steps]
    if not kept:
        raise ValueError(f"max_steps={max_steps}: run {record['key']} has no attempt that short "
                         f"(its first has {record['attempts'][0]['steps']} steps)")
    last = kept[-1]
    same = last is record["attempts"][-1]
    return last["final_loss"], (record["final_stderr"] if same else math.nan)


def depth_sweep_of(data: dict, variants: Sequence[str], prior: str = "tree", drop_failed: bool = False,
                   max_steps: int | None = None):
    """A stored depth sweep as a :class:`fvlib.experiments.inbuild.DepthSweep` (keys: the variants),
    for :func:`fvlib.plots.training.plot_depth_sweep`; only budgets stored for every seed of
    every variant are kept, seeds in increasing order. ``drop_failed``: also leave out the
    budgets where a seed of a variant failed by :data:`~fvlib.experiments.rules.FAILURE_RULE` (a mean over seeds would
    mix a failed run into the curve; report those budgets on their own). ``max_steps``: each
    run's loss as its last attempt of at most that many steps left it (:func:`attempt_loss`;
    how much the curve owes to the longer retrains)."""
    rows = {(r["variant"], r["budget"]): r for r in summarise(data) if r["prior"] == prior}
    budgets = sorted({b for (v, b) in rows if v in variants})
    seeds = sorted({s for r in rows.values() for s in r["seeds"]})
    budgets = [b for b in budgets if all((v, b) in rows and rows[(v, b)]["seeds"] == seeds for v in variants)]
    if drop_failed:
        def failed_at(record: dict) -> bool:   # judged on the loss the sweep uses
            return failed(data, {**record, "final_loss": attempt_loss(record, max_steps)[0]})

        budgets = [b for b in budgets if not any(failed_at(data["runs"][run_key(v, prior, b, s)])
                                                 for v in variants for s in seeds)]
    sweep = DepthSweep(budgets=np.array(budgets, dtype=int), seeds=tuple(seeds))
    by_key = data["runs"]
    for v in variants:
        records = [[by_key[run_key(v, prior, b, s)] for b in budgets] for s in seeds]
        pairs = np.array([[attempt_loss(r, max_steps) for r in row] for row in records]).reshape(
            len(seeds), len(budgets), 2)
        loss, se = pairs[..., 0], pairs[..., 1]
        sweep.seed_loss[v], sweep.seed_stderr[v] = loss, se
        sweep.loss[v], sweep.stderr[v], sweep.spread[v] = seed_mean(loss, se)
    return sweep


def theory_curves(data: dict, names: Sequence[str], budgets: Sequence[int] | None = None) -> dict:
    """``{name: (mean (n,), stderr (n,))}`` of a stored depth sweep's theory curves, at
    ``budgets`` (default: all stored)."""
    theory = data["theory"]
    index = [theory["budgets"].index(int(b)) for b in (budgets if budgets is not None else theory["budgets"])]
    return {n: (np.array(theory["curves"][n]["mean"])[index], np.array(theory["curves"][n]["stderr"])[index])
            for n in names}


def decay_fits(data: dict, variants: Sequence[str], theory_names: Sequence[str] = (), prior: str = "tree",
               budgets: Sequence[int] | None = None, drop_failed: bool = False,
               max_steps: int | None = None) -> list[dict]:
    """Exponential and power-law fits (:func:`fvlib.theory.fits.fit_decay`) of a stored depth
    sweep's curves over ``budgets`` (default: every budget stored for all seeds).

    One row per trained variant and seed, one for each variant's mean over seeds, one per
    theory curve of ``theory_names``: ``{"curve", "seed" (an int, or "mean" / "theory"),
    "budgets", "loss" (n,), "fit" (DecayFit), "factor" (the fitted drop factor per extra
    budget, ``1 / fit.exp_base``), "drops" ((n - 1,): loss(M) / loss(M + 1))}``.
    ``drop_failed``, ``max_steps``: as in :func:`depth_sweep_of` (the theory curves do not
    depend on ``max_steps``).
    """
    sweep = depth_sweep_of(data, variants, prior, drop_failed=drop_failed, max_steps=max_steps)
    keep = list(range(len(sweep.budgets))) if budgets is None else \
        [list(sweep.budgets).index(int(b)) for b in budgets]
    x = sweep.budgets[keep]
    curves = []
    for v in variants:
        curves += [(v, s, sweep.seed_loss[v][i][keep]) for i, s in enumerate(sweep.seeds)]
        curves.append((v, "mean", sweep.loss[v][keep]))
    curves += [(n, "theory", mean) for n, (mean, _) in theory_curves(data, theory_names, x).items()]
    rows = []
    for name, seed, loss in curves:
        fit = fit_decay(x, loss)
        rows.append({"curve": name, "seed": seed, "budgets": x.tolist(), "loss": np.asarray(loss), "fit": fit,
                     "factor": 1 / fit.exp_base, "drops": np.asarray(loss[:-1]) / np.asarray(loss[1:])})
    return rows


#: The rows of :func:`sweep_table_rows` for each variant: label -> value(point row, best adaptive).
_SWEEP_TABLE_ROWS = {
    "mean loss": lambda q, best: q["mean"],
    "sd over seeds": lambda q, best: q["spread"],
    "failed seeds": lambda q, best: len(q["failed"]),
    "mean without failed": lambda q, best: q["mean_ok"],
    "/ best adaptive": lambda q, best: q["mean"] / best,
    "/ greedy, paired": lambda q, best: q.get("ratio_mean", ""),
    "steps": lambda q, best: "/".join(f"{s // 1000}k" for s in q["steps"]),
    "not converged": lambda q, best: q["not_converged"],
}


def sweep_table_rows(data: dict, variants: Sequence[str], theory_names: Sequence[str],
                     prior: str = "tree") -> list[list]:
    """The rows of a stored depth sweep's table, one column per budget of its theory curves.

    For each variant: ``"<variant>: mean loss"``, ``": sd over seeds"``, ``": failed seeds"`` (a
    count, :func:`~fvlib.experiments.rules.failed`), ``": mean without failed"`` (``nan`` when every seed failed),
    ``": / best adaptive"`` (mean over seeds divided by the smaller of the ``adaptive_greedy`` and
    ``adaptive_opt`` theory curves), ``": / greedy, paired"`` (mean over seeds of each run's ratio to greedy on its
    own contexts), ``": steps"`` (per seed, in thousands) and ``": not converged"`` (a count).
    A budget not stored for every seed of a variant is ``""`` in that variant's rows (a point
    stored for some seeds only is left out, as :func:`depth_sweep_of` leaves it out). Then one
    row ``"theory: <name>"`` per curve of ``theory_names``. Each row: label, then one value per
    budget."""
    budgets = list(data["theory"]["budgets"])
    curves = theory_curves(data, ("adaptive_greedy", "adaptive_opt"))
    best = np.minimum(curves["adaptive_greedy"][0], curves["adaptive_opt"][0])
    point = {(r["variant"], r["budget"]): r for r in point_rows(data) if r["prior"] == prior}
    rows = []
    for v in variants:
        full = set(depth_sweep_of(data, (v,), prior).budgets.tolist())
        points = [point[v, m] if m in full else None for m in budgets]
        rows += [[f"{v}: {label}"] + [value(q, b) if q else "" for q, b in zip(points, best)]
                 for label, value in _SWEEP_TABLE_ROWS.items()]
    rows += [[f"theory: {k}"] + list(mean) for k, (mean, _) in theory_curves(data, theory_names).items()]
    return rows


def point_rows(data: dict) -> list[dict]:
    """:func:`summarise` with the failures of each point: ``failed`` (the seeds that failed by
    :data:`~fvlib.experiments.rules.FAILURE_RULE`), ``mean_ok`` / ``spread_ok`` over the other seeds (``nan`` if none),
    and each seed's ``last_fifth_drop`` and ``doubling_gain``."""
    rows, points = summarise(data), _records_by_point(data)
    for row in rows:
        records = points[row["variant"], row["prior"], row["budget"]]
        bad = [failed(data, r) for r in records]
        ok = np.array([r["final_loss"] for r, b in zip(records, bad) if not b])
        row["failed"] = [r["seed"] for r, b in zip(records, bad) if b]
        row["last_fifth_drop"] = [last_fifth_drop(r["history"], r["steps"]) for r in records]
        row["doubling_gain"] = [doubling_gain(r) for r in records]
        row["mean_ok"] = float(ok.mean()) if len(ok) else math.nan
        row["spread_ok"] = float(ok.std(ddof=1)) if len(ok) > 1 else math.nan
    return rows


#: The references each point of a controls experiment is divided by (:func:`controls_rows`), by
#: prior: on the tree the greedy and optimised adaptive policies and the optimised non-adaptive
#: directions (Monte Carlo curves of the file), on the Gaussian twin its closed form.
CONTROL_REFERENCES = {"tree": ("adaptive_greedy", "adaptive_opt", "nonadaptive_opt"), "gaussian-twin": ("twin",)}


def _reference(theory: dict, name: str, budget: int) -> tuple[float, float]:
    i = theory["budgets"].index(budget)
    if name == "twin":
        return theory["twin"][i], 0.0
    curve = theory["curves"][name]
    return curve["mean"][i], curve["stderr"][i]


def controls_rows(data: dict, against: str = "B") -> list[dict]:
    """One row per point of a controls experiment (a depth-sweep file, e.g. ``controls-k6``):
    :func:`summarise`'s row plus ``total_stderr`` (the standard error of the seed mean counting
    the seeds' spread and the Monte Carlo error, :func:`fvlib.stats.seed_mean_stderr`),
    ``failed`` (seeds failed by :data:`~fvlib.experiments.rules.FAILURE_RULE`, counted among the
    seeds, never replaced), ``ratio_to_<against>`` (``(ratio, stderr)`` to the ``against`` variant
    at the same prior and budget; absent for ``against`` itself) and ``ratio_to/<reference>``
    (``(ratio, stderr)`` to each reference of :data:`CONTROL_REFERENCES`), each ratio with the
    delta-method standard error of two independent estimates (:func:`fvlib.stats.independent_ratio`)."""
    theory = data["theory"] or {}
    if "budgets" not in theory:
        raise ValueError(f"controls_rows needs a depth-sweep result (theory with budgets), got theory keys "
                         f"{sorted(theory)}")
    rows = summarise(data)
    for row in rows:
        row["total_stderr"] = seed_mean_stderr(row["loss"], row["loss_stderr"])
        keys = [run_key(row["variant"], row["prior"], row["budget"], s) for s in row["seeds"]]
        row["failed"] = int(sum(failed(data, data["runs"][k]) for k in keys))
    by_point = {(r["variant"], r["prior"], r["budget"]): r for r in rows}
    for row in rows:
        estimate = (row["mean"], row["total_stderr"])
        other = by_point.get((against, row["prior"], row["budget"]))
        if other is not None and row["variant"] != against:
            row[f"ratio_to_{against}"] = independent_ratio(estimate, (other["mean"], other["total_stderr"]))
        for name in CONTROL_REFERENCES.get(row["prior"], ()):
            row[f"ratio_to/{name}"] = independent_ratio(estimate, _reference(theory, name, row["budget"]))
    return rows


#: The theory curves drawn beside the trained ones of a controls experiment, by prior
#: (:func:`controls_panels`): on the tree greedy (adaptive), the best fixed coordinates, the
#: optimised fixed directions and the linear estimator; on the Gaussian twin its closed form.
CONTROL_CURVES = {"tree": ("adaptive_greedy", "nonadaptive_best_coord", "nonadaptive_opt", "lmmse"),
                  "gaussian-twin": ("twin",)}


def controls_panels(data: dict, drop_failed: bool = False) -> list[tuple]:
    """The panels of a controls experiment's headline figure
    (:func:`fvlib.plots.training.plot_controls`), one per prior it trained on (tree first):
    ``(prior, sweep, theory)`` with ``sweep`` the :func:`depth_sweep_of` of every variant stored
    on that prior (budgets stored for every seed of every variant) and ``theory``
    ``{name: (mean (n,), stderr (n,))}`` of :data:`CONTROL_CURVES` at those budgets (the twin's
    closed form has no Monte Carlo error: stderr 0). ``drop_failed``: as in :func:`depth_sweep_of`."""
    theory = data["theory"] or {}
    if "budgets" not in theory:
        raise ValueError(f"controls_panels needs a depth-sweep result (theory with budgets), got theory keys "
                         f"{sorted(theory)}")
    rows = summarise(data)
    panels = []
    for prior in sorted({r["prior"] for r in rows}, key=lambda p: p != "tree"):
        variants = sorted({r["variant"] for r in rows if r["prior"] == prior}, key=_variant_order)
        sweep = depth_sweep_of(data, variants, prior, drop_failed=drop_failed)
        index = [theory["budgets"].index(int(b)) for b in sweep.budgets]
        if prior == "gaussian-twin":
            curves = {"twin": (np.asarray(theory["twin"])[index], np.zeros(len(index)))}
        else:
            curves = theory_curves(data, [n for n in CONTROL_CURVES[prior] if n in theory["curves"]], sweep.budgets)
        panels.append((prior, sweep, curves))
    return panels


def _variant_order(variant: str) -> tuple:
    """The order of :data:`~fvlib.experiments.definitions.CONTROL_VARIANTS`; other variants after, by name."""
    return (CONTROL_VARIANTS.index(variant) if variant in CONTROL_VARIANTS else len(CONTROL_VARIANTS), variant)
