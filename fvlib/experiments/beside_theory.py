"""A trained model beside the theory (chapter 5, *Gaussian prior*; chapter 8, *Experiments*):
the model's excess loss against theory references on the *same* contexts, with the standard
error of the paired ratio (:func:`fvlib.stats.paired_ratio`).

* :data:`MATCHING_BASELINE`, :func:`theory_reference` and :func:`baseline_predictor` -- the
  theory value each model is measured against (A: greedy, B: optimised non-adaptive
  directions, C: LMMSE; a closed form on Gaussian priors), as a number and as a predictor;
* :func:`compare_with_theory` -- a model next to its matching baseline on its evaluation
  contexts;
* :func:`greedy_paired` -- a model against the greedy policy on the same contexts;
* :func:`gap_table` and :func:`gap_record` -- model A and its router with the Bayes decoder
  (:func:`fvlib.interventions.router.router_bayes_decode`) beside greedy, the optimised
  non-adaptive directions and the optimised adaptive policy, for one trained run; the record
  is the table as JSON-able lists; :func:`gap_cost`, the table's cost before any work.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import torch

from .._checks import check_int, check_seed
from ..interventions.router import router_bayes_decode
from ..priors import TreePrior, get_prior_kind
from ..resources import check_fits
from ..stats import mean_and_stderr, paired_ratio
from ..theory import (
    GreedyRule,
    channel_tau2,
    evaluate_strategies,
    gaussian_coordinate_loss,
    optimise_adaptive_policy,
    optimise_directions,
    policy_predictor,
    strategy_predictor,
)
from ..training import EVAL_SEED_OFFSET, TrainConfig, build_prior
from ..training.evaluate import (
    per_context_errors,
    per_context_losses,
    sample_eval_batches,
)

__all__ = [
    "MATCHING_BASELINE",
    "baseline_predictor",
    "compare_with_theory",
    "gap_cost",
    "gap_record",
    "gap_table",
    "greedy_paired",
    "theory_reference",
]


#: The theory baseline each model is measured against (chapter 8, *Experiments*).
MATCHING_BASELINE = {"A": "adaptive_greedy", "B": "nonadaptive_opt", "C": "lmmse"}


def theory_reference(config: TrainConfig, samples: int = 4000, seed: int = 0, *,
                     directions: torch.Tensor | None = None) -> dict:
    """The theory value a model of ``config`` should be compared with.

    Tree prior: model A against the adaptive greedy policy, B against optimised non-adaptive
    directions, C against LMMSE (Monte Carlo, finite-N statistics, ``samples`` contexts drawn
    with ``seed``). ``directions``: B's ``Q (M, D)`` (e.g. stored ones); optimised with ``seed``
    when omitted (:func:`~fvlib.theory.strategies.optimise_directions`).
    Gaussian priors: the closed form of measuring the ``M`` largest-variance coordinates, the
    same for A, B and C (depth buys nothing). Returns ``{"name", "value", "stderr", "samples"}``.
    """
    prior = build_prior(config)
    tau2 = channel_tau2(prior, config.n_ctx, config.noise_std)
    if not prior.is_tree:
        value = gaussian_coordinate_loss(torch.diagonal(prior.second_moment()), config.budget, tau2)
        return {"name": "gaussian_closed_form", "value": value, "stderr": 0.0, "samples": 0}
    name = MATCHING_BASELINE[config.model]
    est = evaluate_strategies(prior, config.n_ctx, config.noise_std, config.budget, samples=samples, seed=seed,
                              strategies=(name,), directions=directions)[name]
    return {"name": name, "value": est.mean, "stderr": est.stderr, "samples": est.n}


def baseline_predictor(config: TrainConfig, seed: int = 0):
    """The matching theory baseline of a tree-prior run (:data:`MATCHING_BASELINE`) as a
    predictor, ``batch -> theta_hat`` (:mod:`fvlib.theory.predictors`); ``nonadaptive_opt``'s
    directions are optimised with ``seed`` (as :func:`theory_reference` does)."""
    tree = build_prior(config)
    if not tree.is_tree:
        raise ValueError(f"baseline_predictor needs a tree prior (the others have a closed form), "
                         f"got {config.prior!r}")
    name = MATCHING_BASELINE[config.model]
    directions = None
    if name == "nonadaptive_opt":
        tau2 = channel_tau2(tree, config.n_ctx, config.noise_std)
        directions = optimise_directions(tree, config.budget, tau2, seed=seed)
    return strategy_predictor(name, tree, config.budget, directions=directions)


def compare_with_theory(model, config: TrainConfig, contexts: int = 4000, seed: int = 0) -> dict:
    """A trained model's excess loss next to its matching theory baseline, **paired**: both on
    the same ``contexts`` evaluation contexts (drawn with ``seed + EVAL_SEED_OFFSET``, those of
    :func:`~fvlib.training.evaluate.evaluate`).

    Tree prior: the baseline of :data:`MATCHING_BASELINE` as a predictor
    (:func:`baseline_predictor`) on the model's own contexts; ``ratio`` is the paired ratio of
    the means with its standard error (:func:`fvlib.stats.paired_ratio`). Gaussian priors: the
    closed form of :func:`theory_reference` (no Monte Carlo error), ``ratio_stderr`` the model's
    standard error over it.

    Returns ``{"model", "model_stderr", "theory", "theory_stderr", "theory_name", "ratio",
    "ratio_stderr", "contexts"}`` with ``ratio = model / theory``.
    """
    check_int("contexts", contexts, 2)
    prior = build_prior(config)
    batches = sample_eval_batches(prior, config.n_ctx, config.noise_std, contexts, seed + EVAL_SEED_OFFSET,
                                  statistic=config.statistic)
    errors = per_context_losses(model, batches)[0]
    model_mean, model_se = (float(v) for v in mean_and_stderr(errors))
    if prior.is_tree:
        theory_errors = per_context_errors({"theory": baseline_predictor(config, seed)}, batches)["theory"]
        theory, theory_se = (float(v) for v in mean_and_stderr(theory_errors))
        ratio, ratio_se = paired_ratio(errors, theory_errors)
        name = MATCHING_BASELINE[config.model]
    else:
        ref = theory_reference(config)
        name, theory, theory_se = ref["name"], ref["value"], 0.0
        ratio, ratio_se = model_mean / theory, model_se / theory
    return {"model": model_mean, "model_stderr": model_se, "theory": theory, "theory_stderr": theory_se,
            "theory_name": name, "ratio": ratio, "ratio_stderr": ratio_se, "contexts": contexts}


def greedy_paired(model, config: TrainConfig, *, contexts: int | None = None, seed: int | None = None) -> dict:
    """A trained model of a tree-prior run against the greedy policy on the *same* contexts.

    The contexts are those of :func:`fvlib.training.evaluate.evaluate` with the same ``contexts`` and ``seed``
    (so ``greedy_loss`` sits beside the model's ``evaluate`` loss, context by context); by
    default the run's own evaluation set (``config.eval_contexts`` contexts drawn with
    ``config.effective_data_seed + EVAL_SEED_OFFSET``: those of its ``history``). Returns
    ``{"model_loss", "model_stderr", "greedy_loss", "greedy_stderr", "ratio", "ratio_stderr",
    "contexts"}``: ``ratio`` is the model's loss over greedy's with the standard error of the
    paired ratio (:func:`fvlib.stats.paired_ratio`).
    """
    if not get_prior_kind(config.prior).is_tree:
        raise ValueError(f"greedy_paired needs a tree prior, got {config.prior!r}")
    contexts = config.eval_contexts if contexts is None else check_int("contexts", contexts, 2)
    seed = config.effective_data_seed + EVAL_SEED_OFFSET if seed is None else check_seed("seed", seed)
    tree = build_prior(config)
    batches = sample_eval_batches(tree, config.n_ctx, config.noise_std, contexts, seed, statistic=config.statistic)
    # the model's per-context excess loss as evaluate() scores it: |theta_hat - theta|^2 for a
    # constrained model, the query-token error against <theta, x_q> for a standard transformer
    model_errors = per_context_losses(model, batches)[0]
    greedy = per_context_errors({"greedy": strategy_predictor("adaptive_greedy", tree, config.budget)},
                                batches)["greedy"]
    model_mean, model_se = mean_and_stderr(model_errors)
    mean, se = mean_and_stderr(greedy)
    ratio, ratio_se = paired_ratio(model_errors, greedy)
    return {"model_loss": float(model_mean), "model_stderr": float(model_se), "greedy_loss": float(mean),
            "greedy_stderr": float(se), "ratio": ratio, "ratio_stderr": ratio_se,
            "contexts": int(model_errors.numel())}


#: The seconds and bytes per context of :func:`gap_table`, measured on one core (OMP_NUM_THREADS=1)
#: by running ``python -m fvlib gap --json`` at 10 and 4000-32000 contexts on runs of model A
#: (depth 3, N = 32 and depth 6, N = 128 on the pooled statistic; depth 5, N = 64 on the tokens),
#: the slope of the wall time and of the peak resident memory (``ru_maxrss``): 28 / 87 / 112 us
#: and 1.5 / 9.6 / 7.6 kB per context, which the formulas of :func:`gap_cost` match within a factor
#: of 2. The cost of the optimisation (independent of ``contexts``) is left out.
_GAP_SECONDS_PER_CONTEXT = 1e-5
_GAP_SECONDS_PER_TOKEN_NUMBER = 1e-8
_GAP_NUMBERS_PER_DIM = 40


def gap_cost(config: TrainConfig, contexts: int) -> tuple[float, float]:
    """``(seconds, bytes)``: a rough estimate, before any work, of the part of :func:`gap_table`
    that grows with ``contexts`` on one core. Every context is held at once (its pooled
    statistic, or its ``N (D + 1)`` token numbers when the run reads tokens, and about
    ``40 (D + 1)`` float32 numbers of references, errors and copies); the time grows with ``D``
    (the references) and the token numbers."""
    check_int("contexts", contexts, 2)
    D = 2**config.depth - 1
    tokens = 0 if config.statistic else config.n_ctx * (D + 1)
    seconds = contexts * (_GAP_SECONDS_PER_CONTEXT * (2 + D / 8) + _GAP_SECONDS_PER_TOKEN_NUMBER * tokens)
    return seconds, 4.0 * contexts * (_GAP_NUMBERS_PER_DIM * (D + 1) + tokens)


def gap_table(model, config: TrainConfig, *, contexts: int = 4000, seed: int = 0, policy=None,
              others: Mapping | None = None) -> dict:
    """How close a trained model A comes to the best adaptive references, one dict of rows.

    Rows (``(mean, stderr)`` of the excess loss): ``adaptive_greedy``, ``nonadaptive_opt`` and
    ``adaptive_opt`` (:func:`fvlib.theory.strategies.evaluate_strategies` on ``contexts`` finite-``N``
    contexts, ``seed``), ``model`` and ``router_bayes`` (:func:`~fvlib.interventions.router.router_bayes_decode` on
    ``contexts`` task contexts drawn with ``seed``), and ``adaptive_greedy_paired`` and
    ``adaptive_opt_paired``: the two adaptive references again, on the model rows' own contexts,
    so that a model row and these compare paired (greedy's loss has a heavy tail: on two
    independent sets of 4000 contexts it can differ by a fifth); ``best_paired``, the name of the
    smaller of the two, and ``ratios``: ``{model row: (ratio, stderr)}``, each model row over
    that best paired reference, context by context (:func:`fvlib.stats.paired_ratio`).
    ``policy``: an optimised adaptive policy to reuse. ``others``: ``{name: model}``, more
    models A of the same task (e.g. trained with another recipe), decoded on the very same
    contexts: rows ``name`` and ``name + "_router_bayes"``. Also ``adaptive_opt_kind`` (which
    candidate the optimisation kept), ``adaptive_opt_policy`` (the
    :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`) and ``adaptive_opt_seconds`` (its cost).
    A ``contexts`` whose estimated memory (:func:`gap_cost`) is more than there is
    (:func:`fvlib.resources.available_memory`) raises ``ValueError`` before any work.
    """
    if not get_prior_kind(config.prior).is_tree:
        raise ValueError(f"gap_table needs a tree prior, got {config.prior!r}")
    check_fits("contexts", contexts, gap_cost(config, contexts)[1])  # the contexts are held on the CPU
    tree = TreePrior(config.depth, config.alpha)
    tau2 = channel_tau2(tree, config.n_ctx, config.noise_std)
    start = time.perf_counter()
    directions = optimise_directions(tree, config.budget, tau2, seed=seed)
    if policy is None:
        policy = optimise_adaptive_policy(tree, config.budget, tau2, directions=directions, seed=seed)
    seconds = time.perf_counter() - start
    est = evaluate_strategies(tree, config.n_ctx, config.noise_std, config.budget, samples=contexts, seed=seed,
                              strategies=("adaptive_greedy", "nonadaptive_opt", "adaptive_opt"),
                              directions=directions, policy=policy)
    out = {name: (e.mean, e.stderr) for name, e in est.items()}
    batches = sample_eval_batches(tree, config.n_ctx, config.noise_std, contexts, seed, statistic=config.statistic)
    references = {"adaptive_greedy_paired": policy_predictor(tree, GreedyRule(tree), config.budget),
                  "adaptive_opt_paired": policy_predictor(tree, policy.policy, config.budget)}
    paired = per_context_errors(references, batches)   # on the model rows' contexts
    for name, errors in paired.items():
        mean, stderr = mean_and_stderr(errors)
        out[name] = (float(mean), float(stderr))
    best = min(paired, key=lambda name: float(paired[name].mean()))
    out["best_paired"] = best
    out["ratios"] = {}
    named = {"": model, **dict(others or {})}
    for prefix in named:
        if prefix and (not isinstance(prefix, str) or prefix in out or prefix in ("model", "router_bayes")):
            raise ValueError(f"others: names must be new strings, not a row of the table, got {prefix!r}")
    for prefix, each in named.items():
        device = next(each.parameters()).device
        parts = [router_bayes_decode(each, tree, b.to(device)) for b in batches]
        n = sum(p["contexts"] for p in parts)
        for name in ("model", "router_bayes"):
            mean = sum(p[name][0] * p["contexts"] for p in parts) / n
            var = sum((p[name][1] ** 2) * p["contexts"] ** 2 for p in parts) / n**2
            row = name if not prefix else (prefix if name == "model" else f"{prefix}_router_bayes")
            out[row] = (mean, math.sqrt(var))
            errors = torch.cat([p["per_context"][name] for p in parts])
            out["ratios"][row] = paired_ratio(errors, paired[best])
    out["adaptive_opt_kind"] = policy.kind
    out["adaptive_opt_policy"] = policy
    out["adaptive_opt_seconds"] = seconds
    out["contexts"] = contexts
    return out


def gap_record(model, config: TrainConfig, *, contexts: int = 4000, seed: int = 0) -> dict:
    """:func:`gap_table` of ``model`` as JSON-able lists (what a stored run keeps of it).

    Returns ``{"rows": {row: [mean, stderr]}, "ratios": {model row: [ratio, stderr]},
    "best_paired", "adaptive_opt_kind", "adaptive_opt_seconds", "contexts", "seed"}``.
    """
    table = gap_table(model, config, contexts=contexts, seed=seed)
    rows = {k: list(v) for k, v in table.items() if isinstance(v, tuple)}
    return {"rows": rows, "ratios": {k: list(v) for k, v in table["ratios"].items()},
            "best_paired": table["best_paired"], "adaptive_opt_kind": table["adaptive_opt_kind"],
            "adaptive_opt_seconds": table["adaptive_opt_seconds"], "contexts": table["contexts"], "seed": seed}
