"""The chapters' analyses: Monte Carlo sweeps of the theory, measurements inside trained
models and the gap between model A and the best references, returning plain results that
:mod:`fvlib.plots` draws.

This layer sits between :mod:`fvlib.interventions` and :mod:`fvlib.plots`: it computes and does not
draw; the figure functions take its results. The runs it looks into are those of
:mod:`fvlib.catalogue`. One section per chapter family:

Theory beside the depth sweep (chapter 8, *Experiments*):

* :func:`depth_sweep_theory` -- the theory curves beside :func:`fvlib.catalogue.depth_sweep`.

Decay with depth and budget (chapter 6, *Tree prior*):

* :func:`closed_form_curves` -- the two noise-free closed forms over a range of budgets;
* :func:`best_coord_curves` -- the noise-free loss of the best fixed coordinate set and its
  two bounds over a range of budgets;
* :func:`decay_sweep` -- Monte Carlo losses of several strategies over a range of budgets
  (one :func:`fvlib.theory.strategies.evaluate_strategies` call per budget, same seed, so
  every budget sees the same contexts);
* :func:`advantage_sweep` -- the adaptive advantage over a grid of ``alpha`` and context
  lengths ``N``.

Inside a trained model (chapters 9, *Inside the model*, and 10, *Causal interventions*):

* :func:`measurement_profile` -- where each layer of a gated-router model puts its
  measurement weight, relative to the context's own path;
* :func:`workspace_projections` -- principal-component projections of the workspace
  ``Phi_l`` of every layer.

Which half of model A falls short (chapter 8, *Experiments*):

* :func:`router_directions` -- the measurement rows model A's router used in each context;
* :func:`router_bayes_decode` -- model A's own decoder against the exact posterior given the
  directions its router used in each context (router + Bayes decoder), on the same contexts;
* :func:`router_policy_alignment` -- how far the router measures what a theory policy measures;
* :func:`fvlib.stats.paired_ratio` and :func:`greedy_paired` -- a model against greedy on the same
  contexts, with the standard error of the paired ratio;
* :func:`gap_table` -- model A and its router with the Bayes decoder beside greedy, the
  optimised non-adaptive directions and the optimised adaptive policy, for one trained run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ._checks import check_int, check_seed
from .hooks import hook_name
from .priors import TreePrior
from .stats import mean_and_stderr, paired_ratio, squared_error
from .theory import (
    FiniteSampleChannel,
    best_fixed_method,
    best_fixed_nodes,
    channel_tau2,
    evaluate_strategies,
    fixed_set_lower_bound,
    noisefree_adaptive_loss,
    noisefree_nodes_loss,
    noisefree_nonadaptive_loss,
    optimise_adaptive_policy,
    optimise_directions,
    policy_predictor,
    policy_rollout,
    strategy_predictor,
)
from .theory.adaptive_opt import GreedyRule
from .training import TrainConfig, build_prior
from .training.evaluate import per_context_errors, per_context_losses, sample_eval_batches

__all__ = [
    "depth_sweep_theory",
    "closed_form_curves",
    "best_coord_curves",
    "DecaySweep",
    "decay_sweep",
    "AdvantageGrid",
    "advantage_sweep",
    "measurement_profile",
    "workspace_projections",
    "router_directions",
    "router_bayes_decode",
    "router_policy_alignment",
    "greedy_paired",
    "gap_table",
]


# ----------------------------------------------------------------------------------------
# Theory beside the depth sweep (chapter 8)
# ----------------------------------------------------------------------------------------
def depth_sweep_theory(
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    budgets: Sequence[int],
    samples: int = 2000,
    seed: int = 0,
    strategies: Sequence[str] = ("adaptive_greedy", "nonadaptive_opt", "nonadaptive_coord"),
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Theory curves for :func:`fvlib.plots.training.plot_depth_sweep`: ``{strategy: (mean (n,), stderr (n,))}``.

    One :func:`fvlib.theory.strategies.evaluate_strategies` call per budget (finite-``N`` statistics,
    ``samples`` contexts, the same ``seed`` for every budget).
    """
    per = [
        evaluate_strategies(tree, n_ctx, noise_std, int(m), samples=samples, seed=seed, strategies=tuple(strategies))
        for m in budgets
    ]
    return {s: (np.array([p[s].mean for p in per]), np.array([p[s].stderr for p in per])) for s in strategies}


# ----------------------------------------------------------------------------------------
# Decay with depth and budget (chapter 6)
# ----------------------------------------------------------------------------------------
def closed_form_curves(tree: TreePrior, budgets) -> dict[str, np.ndarray]:
    """Noise-free losses at each budget ``M`` in ``budgets`` (positive integers).

    Returns ``{"adaptive": (len(budgets),), "nonadaptive": (len(budgets),)}`` from
    :func:`fvlib.theory.closed_forms.noisefree_adaptive_loss` (``L = M`` layers, one node each) and
    :func:`fvlib.theory.closed_forms.noisefree_nonadaptive_loss` (the first ``M`` nodes in heap order).
    """
    budgets = [int(m) for m in budgets]
    return {
        "adaptive": np.array([noisefree_adaptive_loss(tree, m) for m in budgets]),
        "nonadaptive": np.array([noisefree_nonadaptive_loss(tree, m) for m in budgets]),
    }


def best_coord_curves(tree: TreePrior, budgets) -> dict[str, np.ndarray]:
    """Noise-free losses of fixed coordinate sets at each budget ``M`` in ``budgets``.

    Returns ``(len(budgets),)`` arrays: ``"best"``, the loss of
    :func:`fvlib.theory.closed_forms.best_fixed_nodes` (exact: a dynamic program for depth
    ``K <= 6``, every subset for small ``comb(D, M)``; a local search otherwise);
    ``"exact"``, whether that value is the exact optimum (boolean); ``"heap"``, the first
    ``M`` nodes in heap order; ``"lower"``, the bound
    :func:`~fvlib.theory.closed_forms.fixed_set_lower_bound` below which no fixed set of ``M``
    coordinates can go; ``"upper"``, the loss ``sum_{k >= L} alpha^k`` of reading all
    ``2^(L-1)`` nodes of level ``L - 1`` for the largest ``L`` with ``2^(L-1) <= M`` (the
    remaining reads are not counted), an upper bound on the best set. Also ``"nodes"``: a
    list of the best sets.
    """
    budgets = [int(m) for m in budgets]
    a, K = tree.alpha, tree.depth
    nodes = [best_fixed_nodes(tree, m) for m in budgets]
    levels = [min(m.bit_length(), K) for m in budgets]  # L with 2^(L-1) <= M < 2^L
    return {
        "best": np.array([noisefree_nodes_loss(tree, n) for n in nodes]),
        "exact": np.array([best_fixed_method(tree, m) != "local" for m in budgets]),
        "heap": np.array([noisefree_nonadaptive_loss(tree, m) for m in budgets]),
        "lower": np.array([fixed_set_lower_bound(tree, m) for m in budgets]),
        "upper": np.array([sum(a**k for k in range(L, K)) for L in levels]),
        "nodes": nodes,
    }


@dataclass(frozen=True)
class DecaySweep:
    """Monte Carlo losses over budgets.

    ``budgets (B,)``; ``mean[name]`` and ``stderr[name]`` are ``(B,)`` arrays per strategy;
    ``samples`` contexts per budget; ``n_ctx``, ``noise_std`` and the channel variance ``tau2``.
    """

    budgets: np.ndarray
    mean: dict = field(default_factory=dict)
    stderr: dict = field(default_factory=dict)
    samples: int = 0
    n_ctx: int = 0
    noise_std: float = 0.0
    tau2: float = 0.0


def decay_sweep(tree: TreePrior, n_ctx: int, noise_std: float, budgets, *, samples: int = 2000, seed: int = 0,
                strategies=("adaptive_greedy", "nonadaptive_coord"), channel: str = "finite") -> DecaySweep:
    """Excess losses of ``strategies`` at every budget, finite-``N`` statistic by default.

    One :func:`fvlib.theory.strategies.evaluate_strategies` call per budget with the same ``seed``: the
    contexts (and their statistics) are the same at every budget, so the curves are smooth
    and their differences are not Monte Carlo noise between budgets.
    """
    budgets = np.array([int(m) for m in budgets])
    mean = {name: np.empty(len(budgets)) for name in strategies}
    stderr = {name: np.empty(len(budgets)) for name in strategies}
    for i, m in enumerate(budgets):
        est = evaluate_strategies(tree, n_ctx, noise_std, int(m), samples=samples, seed=seed,
                                  strategies=tuple(strategies), channel=channel)
        for name in strategies:
            mean[name][i] = est[name].mean
            stderr[name][i] = est[name].stderr
    return DecaySweep(budgets, mean, stderr, samples, n_ctx, noise_std, channel_tau2(tree, n_ctx, noise_std))


@dataclass(frozen=True)
class AdvantageGrid:
    """Adaptive advantage over a grid: rows ``alphas (A,)``, columns ``n_ctxs (N,)``.

    ``adaptive``, ``baseline`` and their standard errors are ``(A, N)`` Monte Carlo losses;
    ``ratio = baseline / adaptive``; ``log_se`` is the standard error of ``log(ratio)`` by the
    delta method, treating the two estimates as independent (they share contexts and are
    positively correlated, so this overstates the error); ``noisefree_ratio (A,)`` is the
    ratio of the noise-free closed forms (``N -> infinity``) for the coordinate baseline, and
    NaN for other baselines (optimised directions have no closed form).

    With ``best_coord`` (coordinate baseline only) the grid also holds, per row, the best
    fixed coordinate set without noise (:func:`fvlib.theory.closed_forms.best_fixed_nodes`):
    ``noisefree_best (A,)`` its exact noise-free loss, ``noisefree_best_ratio (A,)`` that over
    the noise-free adaptive loss, and ``best_coord``, ``best_coord_se (A, N)`` the Monte Carlo
    loss of reading that set at finite ``N`` (same contexts). No fixed set of ``M``
    coordinates does better at any ``N`` than the best one without noise (the finite-``N``
    reads of a set ``S`` depend on ``theta`` only through ``theta_S``), so
    ``best_lower = noisefree_best / adaptive`` is a lower bound on the advantage over *every*
    fixed coordinate set, and ``best_upper = min(baseline, best_coord) / adaptive`` (the
    better of the two sets tried) an upper bound.
    """

    alphas: np.ndarray
    n_ctxs: np.ndarray
    depth: int
    budget: int
    samples: int
    baseline_name: str
    adaptive: np.ndarray
    adaptive_se: np.ndarray
    baseline: np.ndarray
    baseline_se: np.ndarray
    noisefree_ratio: np.ndarray
    best_coord: np.ndarray | None = None
    best_coord_se: np.ndarray | None = None
    noisefree_best: np.ndarray | None = None
    noisefree_best_ratio: np.ndarray | None = None

    @property
    def ratio(self) -> np.ndarray:
        return self.baseline / self.adaptive

    @property
    def best_lower(self) -> np.ndarray:
        """``noisefree_best / adaptive`` ``(A, N)``: a lower bound on the advantage over every
        fixed coordinate set (``None`` without ``best_coord``); its log has standard error
        ``adaptive_se / adaptive``."""
        return None if self.noisefree_best is None else self.noisefree_best[:, None] / self.adaptive

    @property
    def best_upper(self) -> np.ndarray:
        """``min(baseline, best_coord) / adaptive`` ``(A, N)`` (``None`` without ``best_coord``)."""
        return None if self.best_coord is None else np.minimum(self.baseline, self.best_coord) / self.adaptive

    @property
    def log_se(self) -> np.ndarray:
        return np.hypot(self.adaptive_se / self.adaptive, self.baseline_se / self.baseline)


def advantage_sweep(alphas, n_ctxs, *, depth: int, budget: int, samples: int = 1000, seed: int = 0,
                    noise_std: float = 0.0, baseline: str = "nonadaptive_coord",
                    best_coord: bool = False) -> AdvantageGrid:
    """Monte Carlo ``baseline / adaptive_greedy`` on every ``(alpha, N)`` of a grid.

    Each cell is one :func:`fvlib.theory.strategies.evaluate_strategies` call with ``samples`` contexts
    of a ``TreePrior(depth, alpha)``, budget ``M = budget`` (the adaptive policy uses
    ``L = M`` layers of one node), the finite-``N`` statistic and its own seed
    ``seed + 1000 i + j``. ``baseline`` is ``"nonadaptive_coord"`` (heap order) or
    ``"nonadaptive_opt"`` (the latter optimises directions per cell, which is slow). With
    ``best_coord`` (heap-order baseline only) each cell also reads the best noise-free fixed
    coordinate set of its row on the same contexts (see :class:`AdvantageGrid`); the other
    numbers do not change.
    """
    if best_coord and baseline != "nonadaptive_coord":
        raise ValueError(f"best_coord needs baseline='nonadaptive_coord', got {baseline!r}")
    alphas = np.asarray(alphas, dtype=float)
    n_ctxs = np.asarray(n_ctxs, dtype=int)
    shape = (len(alphas), len(n_ctxs))
    ad, ad_se, bl, bl_se, bc, bc_se = (np.empty(shape) for _ in range(6))
    noisefree, nf_best, nf_best_ratio = (np.empty(len(alphas)) for _ in range(3))
    names = ("adaptive_greedy", baseline) + (("nonadaptive_best_coord",) if best_coord else ())
    for i, a in enumerate(alphas):
        tree = TreePrior(depth, float(a))
        ad_nf = noisefree_adaptive_loss(tree, budget)
        if baseline != "nonadaptive_coord":
            noisefree[i] = math.nan
        else:
            noisefree[i] = noisefree_nonadaptive_loss(tree, budget) / ad_nf if ad_nf > 0 else math.inf
        nodes = best_fixed_nodes(tree, budget) if best_coord else None
        if best_coord:
            nf_best[i] = noisefree_nodes_loss(tree, nodes)
            nf_best_ratio[i] = nf_best[i] / ad_nf if ad_nf > 0 else math.inf
        for j, n in enumerate(n_ctxs):
            est = evaluate_strategies(tree, int(n), noise_std, budget, samples=samples, seed=seed + 1000 * i + j,
                                      strategies=names, nodes=nodes)
            ad[i, j], ad_se[i, j] = est["adaptive_greedy"].mean, est["adaptive_greedy"].stderr
            bl[i, j], bl_se[i, j] = est[baseline].mean, est[baseline].stderr
            if best_coord:
                bc[i, j], bc_se[i, j] = est["nonadaptive_best_coord"].mean, est["nonadaptive_best_coord"].stderr
    extra = (bc, bc_se, nf_best, nf_best_ratio) if best_coord else ()
    return AdvantageGrid(alphas, n_ctxs, depth, budget, samples, baseline, ad, ad_se, bl, bl_se, noisefree, *extra)


# ----------------------------------------------------------------------------------------
# Inside a trained model (chapters 9 and 10)
# ----------------------------------------------------------------------------------------
def measurement_profile(model, tree, batch):
    """Where a gated-router model looks: for every layer ``l`` and tree level ``k``, the mean
    fraction of the squared weight of the measurement matrix ``G_l(Phi_{l-1})`` (all ``d``
    channels together) that falls on the context's *own* path node at level ``k``.

    ``batch``: a :class:`fvlib.task.TaskBatch` from ``tree`` (its ``signs`` give the paths).
    Returns a ``(L, K + 1)`` numpy array; the last column is the weight off the path. Rows sum
    to one. In the ideal adaptive policy row ``l`` is the indicator of level ``l - 1``.
    """
    if model.config.router != "gated":
        raise ValueError(f"measurement_profile needs a gated router, got {model.config.router!r}")
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", "*"))
        nodes = tree.path_nodes(batch.signs.cpu())  # (B, K)
        rows = []
        for l in range(1, model.config.n_layers + 1):
            previous = cache[hook_name("workspace", l - 1)] if l > 1 else batch.x_query.new_zeros(batch.batch_size, 0)
            weight = (model.block(l).router.matrix(previous.to(batch.x_query.dtype)) ** 2).sum(1).double().cpu()  # (B, D)
            weight = weight / weight.sum(-1, keepdim=True)
            on_path = weight.gather(-1, nodes)  # (B, K)
            rows.append(torch.cat([on_path, 1 - on_path.sum(-1, keepdim=True)], dim=-1).mean(0))
    return torch.stack(rows).numpy()


def workspace_projections(model, batch, components: int = 2) -> list[dict]:
    """Principal-component projections of the workspace ``Phi_l`` of every layer.

    ``batch``: a :class:`fvlib.task.TaskBatch` with ``B`` contexts. For each layer ``l`` the
    centred workspaces ``(B, l d)`` are projected on their top ``min(components, l d)``
    principal directions (``torch.linalg.svd``). Returns a list of ``L`` dicts with
    ``coords`` (``(B, c)`` numpy array) and ``explained`` (``(c,)`` fractions of variance).
    """
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", "*"))
    out = []
    for l in range(1, model.config.n_layers + 1):
        phi = cache[hook_name("workspace", l)].double().cpu()
        centred = phi - phi.mean(0)
        _, s, vh = torch.linalg.svd(centred, full_matrices=False)
        c = min(components, vh.shape[0])
        out.append({"coords": (centred @ vh[:c].T).numpy(), "explained": (s[:c] ** 2 / (s**2).sum()).numpy()})
    return out


# ----------------------------------------------------------------------------------------
# Which half of model A falls short (chapter 8)
# ----------------------------------------------------------------------------------------
def router_directions(model, batch) -> torch.Tensor:
    """The measurement rows a gated-router model used in each context, ``(B, L d, D)`` float64.

    Row ``(l - 1) d + c`` is channel ``c`` of ``G_l(Phi_{l-1})``: the model's
    ``phi_l = (1/N) sum_i y_i G_l x_i = G_l g_hat`` with ``g_hat`` the context's statistic.
    """
    if model.config.router != "gated":
        raise ValueError(f"router_directions needs a gated router, got {model.config.router!r}")
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", "*"))
        rows = []
        for l in range(1, model.config.n_layers + 1):
            previous = cache[hook_name("workspace", l - 1)] if l > 1 else batch.x_query.new_zeros(batch.batch_size, 0)
            rows.append(model.block(l).router.matrix(previous.to(batch.x_query.dtype)).double().cpu())
    return torch.cat(rows, dim=1)


def router_bayes_decode(model, tree: TreePrior, batch) -> dict:
    """Model A's decoder against the exact posterior given its router's directions.

    On the contexts of ``batch`` (a :class:`fvlib.task.TaskBatch` from ``tree``): the model's
    own ``theta_hat``, and the exact posterior mean given the readings ``phi = W g_hat`` of the
    rows ``W`` its router chose in that context (:func:`router_directions`; decoded by
    :func:`fvlib.theory.adaptive_opt.policy_rollout` with those rows forced, channel variance
    ``tau^2 = (E|theta|^2 + sigma^2) / N``). The readings are the model's own workspace: the
    function checks this. Returns ``{"model": (mean, stderr), "router_bayes": (mean, stderr),
    "contexts": B, "per_context": {"model": (B,), "router_bayes": (B,)}}`` of the excess loss
    ``|theta_hat - theta|^2``.
    """
    rows = router_directions(model, batch)
    cpu = batch.to("cpu", torch.float64)
    g_hat = cpu.sufficient_statistic()
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", model.config.n_layers))
        theta_model = model.predict_theta(batch).double().cpu()
    workspace = cache[hook_name("workspace", model.config.n_layers)].double().cpu()
    readings = torch.einsum("bmd,bd->bm", rows, g_hat)
    scale = workspace.abs().max().clamp_min(1e-12)
    if not torch.allclose(readings / scale, workspace / scale, atol=1e-3):
        raise ValueError("the router's rows do not reproduce the model's workspace")
    tau2 = channel_tau2(tree, batch.n_ctx, batch.noise_std)
    forced = {s + 1: rows[:, s] for s in range(rows.shape[1])}
    with torch.no_grad():
        bayes = policy_rollout(tree, None, FiniteSampleChannel(g_hat), rows.shape[1], tau2, forced).theta_hat
    out = {"contexts": batch.batch_size, "per_context": {}}
    for name, theta_hat in (("model", theta_model), ("router_bayes", bayes)):
        errors = squared_error(theta_hat, cpu.theta)
        mean, stderr = mean_and_stderr(errors)
        out[name] = (float(mean), float(stderr))
        out["per_context"][name] = errors
    return out


def router_policy_alignment(model, tree: TreePrior, batch, policy) -> torch.Tensor:
    """How far model A's router measures what a theory policy measures: ``(L,)`` float64.

    Entry ``l - 1`` is the mean over the contexts of ``batch`` of ``|cos|`` between the row
    model A's router used at layer ``l`` (:func:`router_directions`, one channel per layer) and
    the row ``policy`` measures at layer ``l`` on the same context's statistic ``g_hat``
    (:func:`fvlib.theory.adaptive_opt.policy_rollout`; ``policy`` e.g. an
    :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`'s ``policy`` or a ``GreedyRule``).
    1 means the same direction in every context; A's decoder can read another policy's
    readings only where this is near 1.
    """
    if model.config.channels != 1:
        raise ValueError(f"router_policy_alignment needs one channel per layer, got {model.config.channels}")
    rows = router_directions(model, batch)
    rows = rows / rows.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    g_hat = batch.to("cpu", torch.float64).sufficient_statistic()
    tau2 = channel_tau2(tree, batch.n_ctx, batch.noise_std)
    with torch.no_grad():
        theory = policy_rollout(tree, policy, FiniteSampleChannel(g_hat), rows.shape[1], tau2).directions
    return (rows * theory).sum(-1).abs().mean(0)


def greedy_paired(model, config: TrainConfig, *, contexts: int, seed: int) -> dict:
    """A trained model of a tree-prior run against the greedy policy on the *same* contexts.

    The contexts are those of :func:`fvlib.training.evaluate.evaluate` with the same ``contexts`` and ``seed``
    (so ``greedy_loss`` sits beside the model's ``evaluate`` loss, context by context). Returns
    ``{"model_loss", "model_stderr", "greedy_loss", "greedy_stderr", "ratio", "ratio_stderr",
    "contexts"}``: ``ratio`` is the model's loss over greedy's with the standard error of the
    paired ratio (:func:`fvlib.stats.paired_ratio`).
    """
    if config.prior != "tree":
        raise ValueError(f"greedy_paired needs a tree prior, got {config.prior!r}")
    check_int("contexts", contexts, 2)
    check_seed("seed", seed)
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


def gap_table(model, config: TrainConfig, *, contexts: int = 4000, seed: int = 0, policy=None,
              others: Mapping | None = None) -> dict:
    """How close a trained model A comes to the best adaptive references, one dict of rows.

    Rows (``(mean, stderr)`` of the excess loss): ``adaptive_greedy``, ``nonadaptive_opt`` and
    ``adaptive_opt`` (:func:`fvlib.theory.strategies.evaluate_strategies` on ``contexts`` finite-``N``
    contexts, ``seed``), ``model`` and ``router_bayes`` (:func:`router_bayes_decode` on
    ``contexts`` task contexts drawn with ``seed``), and ``adaptive_greedy_paired`` and
    ``adaptive_opt_paired``: the two adaptive references again, on the model rows' own contexts,
    so that a model row and these compare paired (greedy's loss has a heavy tail: on two
    independent sets of 4000 contexts it can differ by a fifth); ``best_paired``, the name of the
    smaller of the two, and ``ratios``: ``{model row: (ratio, stderr)}``, each model row over
    that best paired reference, context by context (:func:`fvlib.stats.paired_ratio`). ``policy``: an optimised adaptive policy
    to reuse. ``others``: ``{name: model}``, more models A of the same task (e.g. trained with
    another recipe), decoded on the very same contexts: rows ``name`` and
    ``name + "_router_bayes"``. Also ``adaptive_opt_kind`` (which candidate the optimisation
    kept), ``adaptive_opt_policy`` (the :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`)
    and ``adaptive_opt_seconds`` (its cost).
    """
    if config.prior != "tree":
        raise ValueError(f"gap_table needs a tree prior, got {config.prior!r}")
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
