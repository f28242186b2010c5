"""Key patching on the trained models (chapter 10, *Causal interventions*) and its analogue on
the standard transformers, state patching (chapter 11, *Standard transformers*): one sweep,
:func:`patching_sweep`, specialised by a read-out (:mod:`fvlib.interventions.readout`).

* :func:`key_patching_sweep` -- run the donor, cache its keys at layer ``l``, run the target
  with those keys, measure the target's excess loss; sweep ``(m, l)`` into a heatmap
  ``loss[m - 1, l - 1]`` (a :class:`~fvlib.theory.patching.PatchingResult`, on the pairs of
  :func:`fvlib.theory.patching_policies.theory_patching_sweep` with the same ``seed``).
* :func:`state_patching_sweep` -- the key-patching analogue on a standard transformer,
  bottlenecked arrangement only. What context token ``i`` sends at layer ``l`` is its key
  ``k_i`` and its rank-``d`` value ``v_i``, both functions of its stream, i.e. of its own
  ``(x_i, y_i)`` and of the states ``phi_1..phi_{l-1}`` it has read from the workspace. The
  patch (``kind="sent"``) recomputes them with the target's own tokens (its labels kept) but the
  *donor's* workspace read at layers ``1..l-1``, and lets the target's workspace pool those at
  layer ``l``; everything else is the target's. In the constrained models the keys are exactly
  "what a token sends as a function of the state" (its labels enter only through the pooling),
  so this is key patching with the state made explicit; at ``l = 1`` there is no state yet and
  the patch is the identity. The open arrangement has no separate state (context tokens read
  each other), so it has no such analogue and the sweep raises ``ValueError``.
  ``kind="query"`` patches the other side of the pooling: the workspace's query at layer
  ``l`` (``blocks.{l}.hook_queries``), the donor's.
* :func:`patching_cost` -- the seconds and memory of a sweep, estimated before any work (a
  sweep refuses a ``contexts`` that cannot fit in memory).
* :func:`patch_level_effect` -- one cell of the sweep, resolved by tree level.
* :func:`patching_ratio`, :func:`patching_summary` -- a heatmap read as ratios to the
  unpatched loss of the same targets, summarised after, at and before the split.
* :func:`patching_trends` -- the two trends of the claim "the loss rises when the paths split
  early and the patch is early", counted cell against neighbouring cell after the split.
* :func:`reference_distances` -- which of two theory references (the aware and unaware
  patched policies of :mod:`fvlib.theory.patching_policies`) a heatmap follows: the RMS
  distance over the cells after the split, its standard error by bootstrap over the pairs
  (a :class:`ReferenceDistances`).

Conventions: layers ``l = 1..L`` in column ``l - 1``, split levels ``m = 1..K`` in row ``m - 1``
(:mod:`fvlib.theory.patching`). In the ideal adaptive model layer ``l`` measures the path node
at level ``l - 1``; donor keys at layer ``l`` therefore route the target to its own node when
``l <= m`` (no effect) and to a node off its path when ``l > m``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from .._checks import check_int
from ..hooks import HookedModel, hook_name, replace_with
from ..models import FVTransformer
from ..priors import TreePrior
from ..resources import check_fits
from ..task import StatisticBatch, TaskBatch, make_generator
from ..theory import (
    DEFAULT_CHUNK,
    PatchingResult,
    channel_tau2,
    check_tree,
    greedy_patcher,
    ideal_patching_mask,
    patching_pairs,
    run_patching_sweep,
)
from .readout import EffectiveTheta, PredictTheta, Readout, level_overlap

__all__ = [
    "STATE_PATCH_KINDS",
    "patch_keys",
    "pair_patcher",
    "patching_cost",
    "patching_sweep",
    "key_patching_sweep",
    "state_patching_sweep",
    "patching_ratio",
    "patching_summary",
    "patching_trends",
    "ReferenceDistances",
    "reference_distances",
    "LevelEffect",
    "patch_level_effect",
]

#: What :func:`state_patching_sweep` patches at layer ``l``: what the context tokens send
#: (``"sent"``: keys and values) or what the workspace asks (``"query"``: its pooling query).
STATE_PATCH_KINDS = EffectiveTheta.patch_kinds

#: The donor activations each kind of patch reads (one hook kind, at every layer).
_DONOR_KIND = {"keys": "keys", "query": "queries", "sent": "workspace"}


def patch_keys(model: FVTransformer, target: TaskBatch, donor_keys: torch.Tensor, layer: int) -> torch.Tensor:
    """``theta_hat (B, D)`` of the target run with its keys at ``layer`` (1-based) replaced by
    ``donor_keys (B, N, d)``."""
    name = hook_name("keys", model.block(layer).layer)
    with model.hooks([(name, replace_with(donor_keys))]):
        return model.predict_theta(target)


def _statistic_key_patch(model: FVTransformer, layer: int, target: StatisticBatch, donor_cache) -> list:
    """The key patch on the pooled statistic: donor and target share their inputs ``x_i``, so the
    target pooling the donor's keys ``G_l(Phi_donor) x_i`` against its own labels gives
    ``phi_l = G_l(Phi_donor) g_target``; the hook puts that in place of the target's ``phi_l``."""
    g = target.g.to(next(model.parameters()).dtype)  # as the model's own forward casts it
    previous = donor_cache[hook_name("workspace", layer - 1)] if layer > 1 else g.new_zeros(target.batch_size, 0)
    return [(hook_name("phi", layer), replace_with(model.block(layer).router.pool(g, previous)))]


def _patch_hooks(model: HookedModel, kind: str, layer: int, target: TaskBatch, donor_cache, device) -> list:
    """The hooks of the patch ``kind`` at ``layer``: the donor's activation (``"keys"``,
    ``"query"``), or what the target's tokens send having read the donor's state (``"sent"``);
    keys on the pooled statistic: :func:`_statistic_key_patch`."""
    if isinstance(target, StatisticBatch):
        return _statistic_key_patch(model, layer, target, donor_cache)
    if kind != "sent":
        name = hook_name(_DONOR_KIND[kind], layer)
        return [(name, replace_with(donor_cache[name]))]
    sent = [hook_name("keys", layer), hook_name("values", layer)]
    workspace = [hook_name("workspace", j) for j in range(1, layer)]
    with model.hooks([(name, replace_with(donor_cache[name])) for name in workspace]):
        _, hybrid = model.run_with_cache(target.to(device), names_filter=sent)
    return [(name, replace_with(hybrid[name])) for name in sent]


def pair_patcher(model: HookedModel, read: Readout, kind: str, layers):
    """``run_pair(target, donor) -> (clean theta_hat, [theta_hat with the patch ``kind`` at layer
    l, for l in layers], target, donor)`` for :func:`fvlib.theory.patching.run_patching_sweep`;
    ``read`` reads ``theta_hat`` (:class:`~fvlib.interventions.readout.PredictTheta` or
    :class:`~fvlib.interventions.readout.EffectiveTheta`) and places the batches."""
    statistic = getattr(read, "statistic", False)  # the donor's workspaces give its keys' matrices
    donor_names = [hook_name("workspace" if statistic else _DONOR_KIND[kind], l)
                   for l in range(1, model.config.n_layers + 1)]

    def run_pair(target, donor):
        target, donor = read.batch(target), read.batch(donor)
        read.draw(target)
        _, donor_cache = model.run_with_cache(donor.to(read.device), names_filter=donor_names)
        patched = [read(target, _patch_hooks(model, kind, l, target, donor_cache, read.device)) for l in layers]
        return read(target), patched, target, donor

    return run_pair


#: The cost of :func:`patching_sweep` per context, measured on one core (OMP_NUM_THREADS=1) by
#: running ``python -m fvlib patch --json`` at 10 and 1000-32000 contexts on runs of model A (the
#: constrained model at depth 3 with width 16 and 256, depth 5 and 6 with width 256; the
#: bottlenecked transformer at depth 3, N = 64 and depth 4, N = 32): the slope of the wall time
#: (0.07, 0.13, 0.7, 1.9 ms; 5.6, 6.2 ms per context, the theory's side included) and of the peak
#: resident memory (0.7 kB per context at depth 3, a chunk's forward passes beside), which the
#: formulas of :func:`patching_cost` match within a factor of 2.
_SECONDS_PER_CONSTRAINED_UNIT = 7e-7
_SECONDS_PER_TRANSFORMER_UNIT = 3.8e-8


def patching_cost(model: HookedModel, tree: TreePrior, n_ctx: int, contexts: int,
                  chunk: int = DEFAULT_CHUNK) -> tuple[float, float]:
    """``(seconds, bytes)``: a rough estimate, before any work, of :func:`patching_sweep` of
    ``model`` on ``contexts`` pairs per split level of ``tree``, on one core (both sides of the
    CLI's ``patch``: the model's and the theory's). Per pair and split level the model runs
    ``L + 2`` times (``2 L + 2`` for a standard transformer); the memory is a chunk's forward
    passes and, per context, the ``K (2 L + 1)`` float64 errors kept (with their copies)."""
    check_tree(tree)
    check_int("contexts", contexts, 1)
    config, K = model.config, tree.depth
    L, D = config.n_layers, config.dim
    if isinstance(model, FVTransformer):
        tokens = 1 if model.reads_statistic else n_ctx
        per_context = _SECONDS_PER_CONSTRAINED_UNIT * K * (L + 2) * (D + 1) * tokens * (0.5 + config.width / 256)
        working = 4.0 * (D + 1) * config.width * L * tokens
    else:
        per_context = _SECONDS_PER_TRANSFORMER_UNIT * K * (2 * L + 2) * L * n_ctx * config.d_model
        working = 4.0 * 12 * n_ctx * config.d_model * L
    kept = 4 * 8.0 * K * (2 * L + 1)
    return contexts * per_context, contexts * kept + min(contexts, chunk) * working


@torch.no_grad()
def patching_sweep(
    model: HookedModel,
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    *,
    readout: type[Readout],
    kind: str,
    contexts: int = 2000,
    queries: int | None = None,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
    statistic: bool | None = None,
) -> PatchingResult:
    """Patch the donor's ``kind`` into the target at every layer ``l`` for every split level ``m``,
    read through ``readout``: ``loss[m - 1, l - 1]`` is ``E|theta_hat - theta_target|^2``.

    ``contexts`` donor/target pairs per split level (the same pairs for every layer, and those of
    :func:`fvlib.theory.patching_policies.theory_patching_sweep` with the same ``seed``); ``queries``
    probe queries per context for :class:`~fvlib.interventions.readout.EffectiveTheta`.
    ``kind`` is one of the read-out's ``patch_kinds``: ``"keys"`` (the constrained models),
    ``"sent"`` or ``"query"`` (the bottlenecked standard transformers; module docs). Used as
    :func:`key_patching_sweep` and :func:`state_patching_sweep`. ``statistic`` (key patching
    only): run donor and target on their pooled statistics, the patched slot being
    ``G_l(Phi_donor) g_target`` (equal to the token path to float rounding, and cheaper); ``None``
    takes it for every model that :attr:`~fvlib.models.FVTransformer.reads_statistic`,
    ``False`` keeps the tokens (for hooks on the per-token keys). A ``contexts`` whose estimated
    memory (:func:`patching_cost`) is more than there is (:func:`fvlib.resources.available_memory`)
    raises ``ValueError`` before any work.
    """
    if readout is PredictTheta:
        read = readout(model, queries=queries, seed=seed,
                       statistic=model.reads_statistic if statistic is None else statistic)
    elif statistic:
        raise ValueError(f"statistic=True is for key patching of the constrained models, not {readout.__name__}")
    else:
        read = readout(model, queries=queries, seed=seed)
    if kind not in read.patch_kinds:
        raise ValueError(f"kind must be one of {read.patch_kinds}, got {kind!r}")
    if kind in STATE_PATCH_KINDS and model.config.arrangement != "bottlenecked":
        raise ValueError(
            "state patching needs the bottlenecked arrangement (its context tokens read a separate "
            f"workspace state); got arrangement {model.config.arrangement!r}"
        )
    check_fits("contexts", contexts, patching_cost(model, tree, n_ctx, contexts, chunk)[1])
    L = model.config.n_layers
    run_pair = pair_patcher(model, read, kind, range(1, L + 1))
    return run_patching_sweep(tree, L, n_ctx, noise_std, contexts, seed, chunk, run_pair)


key_patching_sweep = partial(patching_sweep, readout=PredictTheta, kind="keys")
key_patching_sweep.__doc__ = """Key patching of a constrained model (:func:`patching_sweep` with
:class:`~fvlib.interventions.readout.PredictTheta`): its keys at layer ``l`` come from a donor
whose path splits off at level ``m``."""
state_patching_sweep = partial(patching_sweep, readout=EffectiveTheta, kind="sent")
state_patching_sweep.__doc__ = """State patching of a bottlenecked standard transformer
(:func:`patching_sweep` with :class:`~fvlib.interventions.readout.EffectiveTheta`, module docs):
``kind="sent"`` (default) or ``"query"``, ``theta_eff`` from ``queries`` probe queries (32)."""


# ----------------------------------------------------------------------------------------
# Reading a heatmap: ratios to the unpatched loss and their summary
# ----------------------------------------------------------------------------------------
def patching_ratio(result) -> np.ndarray:
    """``(K, L)`` array ``loss[m-1, l-1] / baseline_by_level[m-1]``: the patched loss over the
    unpatched loss of the very same targets (1 = the patch changes nothing on average)."""
    loss = np.asarray(result.loss, dtype=float)
    base = np.asarray(result.baseline_by_level, dtype=float)[:, None]
    return loss / base


def _masks(shape: tuple[int, int]) -> dict[str, np.ndarray]:
    K, L = shape
    m = np.arange(1, K + 1)[:, None] * np.ones((1, L))
    l = np.ones((K, 1)) * np.arange(1, L + 1)[None, :]
    return {"after": l > m, "at": l == m, "before": l < m, "not_after": l <= m}


def patching_summary(result) -> dict[str, float]:
    """Summary numbers of a patching heatmap.

    Returns a dict with

    * ``after``, ``at``, ``before``: the mean of :func:`patching_ratio` over the cells with
      ``l > m``, ``l = m`` and ``l < m`` (``nan`` when there is no such cell);
    * ``max_z_not_after``: the largest ``|loss - baseline_by_level| / stderr`` over the cells
      with ``l <= m`` (how far from "no effect" the flat part is, in standard errors);
    * ``max_rel_not_after``: the largest ``|ratio - 1|`` over the same cells.
    """
    ratio = patching_ratio(result)
    masks = _masks(ratio.shape)
    out = {k: float(ratio[masks[k]].mean()) if masks[k].any() else float("nan") for k in ("after", "at", "before")}
    loss = np.asarray(result.loss, dtype=float)
    se = np.asarray(result.stderr, dtype=float)
    base = np.asarray(result.baseline_by_level, dtype=float)[:, None] * np.ones_like(loss)
    sel = masks["not_after"]
    diff = np.abs(loss - base)[sel]
    z = np.where(diff == 0, 0.0, diff / np.maximum(se[sel], 1e-300))
    out["max_z_not_after"] = float(z.max())
    out["max_rel_not_after"] = float(np.abs(ratio[sel] - 1).max())
    return out


def patching_trends(result, z: float = 2.0) -> dict[str, dict[str, int]]:
    """The trends of a key-patching heatmap after the split (cells ``l > m``), each counted
    over neighbouring cells: ``"split_early"`` compares ``(m, l)`` with ``(m + 1, l)`` (the same
    layer, the paths splitting one level later; ``m + 1 < l``) and ``"patch_early"`` compares
    ``(m, l)`` with ``(m, l + 1)`` (the same split, the patch one layer later).

    Each trend is ``{"held", "reversed", "tested"}``: the pairs where the earlier cell's loss is
    above the later one's by more than ``z`` times their two standard errors added (a
    conservative error: the cells of one row share their targets), the pairs where it is below
    by as much, and the pairs compared. ``z``: a positive number."""
    if not z > 0:
        raise ValueError(f"z must be a positive number, got {z!r}")
    loss = np.asarray(result.loss, dtype=float)
    se = np.asarray(result.stderr, dtype=float)
    K, L = loss.shape
    pairs = {"split_early": [((m, l), (m + 1, l)) for l in range(L) for m in range(K - 1) if m + 1 < l],
             "patch_early": [((m, l), (m, l + 1)) for m in range(K) for l in range(L - 1) if l > m]}
    trends = {}
    for name, cells in pairs.items():
        gaps = [(loss[a] - loss[b]) / (se[a] + se[b]) for a, b in cells]
        trends[name] = {"held": int(sum(g > z for g in gaps)), "reversed": int(sum(g < -z for g in gaps)),
                        "tested": len(gaps)}
    return trends


# ----------------------------------------------------------------------------------------
# Which reference a heatmap follows
# ----------------------------------------------------------------------------------------
@dataclass
class ReferenceDistances:
    """How far a key-patching heatmap is from each of two references, on the same pairs.

    Attributes:
        distance: ``{reference: RMS over the cells with l > m of (loss - reference loss)}``.
        stderr: ``{reference: bootstrap standard error of that distance}``.
        difference: the second reference's distance minus the first's (positive: closer to the
            first).
        difference_stderr: its bootstrap standard error (the same resamples for both distances).
        follows: the name of the closer reference when ``|difference|`` is more than
            ``threshold`` times ``difference_stderr``, else ``"between"``.
        threshold, resamples: the rule's threshold (in standard errors) and the bootstrap's size.
    """

    distance: dict[str, float]
    stderr: dict[str, float]
    difference: float
    difference_stderr: float
    follows: str
    threshold: float
    resamples: int


def _after_split_errors(result, name: str) -> torch.Tensor:
    """``(C, n)`` per-pair squared errors of the cells of ``result`` with ``l > m`` (row-major)."""
    if getattr(result, "errors", None) is None:
        raise ValueError(f"{name} must be a PatchingResult with its per-pair errors, got {type(result).__name__} "
                         "without them (run the sweep again: sweeps keep them, stored heatmaps do not)")
    K, L, _ = result.errors.shape
    return result.errors[ideal_patching_mask(K, L)].double()


def _bootstrap_means(errors: list[torch.Tensor], resamples: int, generator: torch.Generator) -> list[torch.Tensor]:
    """For each ``(C, n)`` tensor of ``errors``, its cell means ``(R, C)`` over ``resamples``
    bootstrap resamples of the ``n`` pairs (the same resamples for every tensor)."""
    n = errors[0].shape[-1]
    draws = torch.randint(n, (resamples, n), generator=generator)
    weights = torch.zeros(resamples, n, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones(resamples, n, dtype=torch.float64)) / n  # (R, n), rows sum to 1
    return [weights @ e.T for e in errors]


def reference_distances(result, references: Mapping, *, resamples: int = 1000, threshold: float = 2.0,
                        seed: int = 0) -> ReferenceDistances:
    """Which of two ``references`` (``{name: PatchingResult}``, e.g. the aware and the unaware
    heatmaps of :func:`fvlib.theory.patching_policies.theory_patching_references`) the heatmap
    ``result`` follows.

    The distance to a reference is the RMS over the cells with ``l > m`` of ``result.loss -
    reference.loss``; its standard error is the standard deviation of that distance over
    ``resamples`` bootstrap resamples of the donor/target pairs (``seed``), the same resample
    for the heatmap and both references, so all must come from sweeps on the same pairs (the
    same ``seed`` and ``contexts``) and keep their per-pair ``errors``. The heatmap *follows*
    the closer reference when the two distances differ by more than ``threshold`` standard
    errors of their difference; otherwise it is ``"between"``. ``ValueError`` for anything but
    two references, heatmaps of different shapes or without per-pair errors, no cell after the
    split (``L = 1``), fewer than 2 resamples or a negative ``threshold``.
    """
    if not isinstance(references, Mapping) or len(references) != 2:
        raise ValueError(f"references must map two names to heatmaps, got {references!r}")
    check_int("resamples", resamples, 2)
    if not threshold >= 0:
        raise ValueError(f"threshold must be >= 0, got {threshold!r}")
    names = list(references)
    errors = [_after_split_errors(result, "result")] + [_after_split_errors(references[k], f"references[{k!r}]")
                                                          for k in names]
    if len({tuple(result.errors.shape)} | {tuple(references[k].errors.shape) for k in names}) != 1:
        raise ValueError("result and references must be heatmaps of the same shape on the same pairs, got "
                         f"{[tuple(r.errors.shape) for r in (result, *references.values())]}")
    if errors[0].shape[0] == 0:
        raise ValueError(f"result has no cell with l > m (shape {tuple(result.errors.shape)})")
    model, *refs = _bootstrap_means(errors, resamples, make_generator(seed))  # (R, C) each
    point = [float((e[0].mean(-1) - e[1].mean(-1)).pow(2).mean().sqrt())
             for e in ((errors[0], errors[1]), (errors[0], errors[2]))]
    boot = [(model - ref).pow(2).mean(-1).sqrt() for ref in refs]  # (R,) each
    difference, difference_se = point[1] - point[0], float((boot[1] - boot[0]).std())
    follows = "between"
    if abs(difference) > threshold * difference_se:
        follows = names[0] if difference > 0 else names[1]
    return ReferenceDistances(distance=dict(zip(names, point)), stderr={k: float(b.std()) for k, b in zip(names, boot)},
                              difference=difference, difference_stderr=difference_se, follows=follows,
                              threshold=float(threshold), resamples=resamples)


# ----------------------------------------------------------------------------------------
# One cell, level by level
# ----------------------------------------------------------------------------------------
@dataclass
class LevelEffect:
    """What one key patch (split level ``m``, layer ``l``) does to each level of the prediction.

    Attributes:
        target: ``(K,)``, mean :func:`~fvlib.interventions.readout.level_overlap` of the patched
            prediction with the target's path at each tree level ``k`` (1 = the target's
            coefficient is recovered).
        donor: ``(K,)``, the same with the donor's path.
        baseline: ``(K,)``, the unpatched prediction's overlap with the target.
        split_level, layer: the patch (``m = 1..K``, ``l = 1..L``).
        n_contexts: donor/target pairs averaged over.
    """

    target: torch.Tensor
    donor: torch.Tensor
    baseline: torch.Tensor
    split_level: int
    layer: int
    n_contexts: int


@torch.no_grad()
def patch_level_effect(
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    *,
    split_level: int,
    layer: int,
    model: FVTransformer | None = None,
    n_layers: int | None = None,
    contexts: int = 500,
    seed: int = 0,
    reference: str = "aware",
) -> LevelEffect:
    """Key-patch layer ``layer`` with donors that split off at ``split_level`` and score the
    prediction level by level (one cell of the sweep, resolved by tree level).

    With ``model`` the trained model is patched (as in :func:`key_patching_sweep`); without it
    the greedy theory policy of depth ``n_layers`` (as in :func:`fvlib.theory.patching_policies.theory_patching_sweep`),
    aware or unaware of the patch (``reference``, one of
    :data:`~fvlib.theory.patching_policies.PATCHING_REFERENCES`; ignored with ``model``).
    ``contexts`` pairs drawn with ``seed``.
    """
    check_tree(tree)
    check_int("contexts", contexts, 1)
    depth = model.config.n_layers if model is not None else check_int("n_layers", n_layers, 1)
    check_int("layer", layer, 1, depth)
    run_pair = (
        pair_patcher(model, PredictTheta(model, statistic=model.reads_statistic), "keys", [layer])
        if model is not None
        else greedy_patcher(tree, depth, channel_tau2(tree, n_ctx, noise_std), [layer], reference=reference)
    )
    pairs = patching_pairs(tree, contexts, split_level, n_ctx, noise_std, make_generator(seed))
    clean, (patched,), target, donor = run_pair(*pairs)
    return LevelEffect(
        target=level_overlap(tree, patched, target.signs).mean(0),
        donor=level_overlap(tree, patched, donor.signs).mean(0),
        baseline=level_overlap(tree, clean, target.signs).mean(0),
        split_level=split_level,
        layer=layer,
        n_contexts=contexts,
    )

