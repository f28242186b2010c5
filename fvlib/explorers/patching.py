"""The patching explorer (chapter 10): split level ``m``, layer ``l`` and the theory reference
(aware or unaware of the patch, :mod:`fvlib.theory.patching_policies`): the key-patching heatmap,
its row ``m``, and what patching cell ``(m, l)`` does to each level of the prediction; the state
is :func:`fvlib.explorers.states.patching_state`."""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets
from matplotlib.figure import Figure

from .._checks import check_int
from ..interventions import key_patching_sweep, patch_level_effect
from ..plots.explorers import plot_patching_cell
from ..priors import TreePrior, check_tree_prior
from ..theory import PATCHING_REFERENCES, PatchingResult, check_reference, theory_patching_sweep
from .base import DrawFn, Explorer, slider
from .live import LiveSpec
from .states import patching_live, patching_state

__all__ = ["patching_explorer"]


def _patching_drawer(tree: TreePrior, n_ctx: int, noise_std: float, n_layers: int, model, sweeps: dict,
                     contexts: int, seed: int) -> tuple[DrawFn, Callable[..., dict]]:
    """``draw(split_level, layer, reference)`` and ``compute`` of the explorer; ``sweeps`` is
    ``{reference: {"model"?, "theory"}}``, filled on demand for a reference not given."""
    effects: dict = {}

    def sweeps_of(reference: str) -> dict:
        if reference not in sweeps:
            shown = {"model": sweeps[next(iter(sweeps))]["model"]} if model is not None else {}
            shown["theory"] = theory_patching_sweep(tree, n_ctx, noise_std, n_layers, contexts=contexts, seed=seed,
                                                    reference=reference)
            sweeps[reference] = shown
        return sweeps[reference]

    def effect_of(split_level: int, layer: int, reference: str):
        key = (split_level, layer, None if model is not None else reference)
        if key not in effects:
            effects[key] = patch_level_effect(tree, n_ctx, noise_std, split_level=split_level, layer=layer,
                                              model=model, n_layers=n_layers, contexts=contexts, seed=seed,
                                              reference=reference)
        return effects[key]

    def compute(split_level: int, layer: int, reference: str = "aware") -> dict:
        return patching_state(sweeps_of(reference), effect_of(split_level, layer, reference))

    def draw(split_level: int, layer: int, reference: str = "aware") -> tuple[Figure, dict, str]:
        summary = compute(split_level, layer, reference)
        figure = plot_patching_cell(sweeps_of(reference), effect_of(split_level, layer, reference))
        source = "trained model" if model is not None else f"greedy theory policy ({reference} of the patch)"
        caption = (f"{source}: patching layer {layer} with donors that split at level {split_level} multiplies "
                   f"the loss by {summary['ratio']:.2f}; theory reference: {reference}. {contexts} donor/target "
                   f"pairs per cell (seed {seed}).")
        return figure, summary, caption

    return draw, compute


def patching_explorer(
    tree: TreePrior | None = None,
    n_layers: int | None = None,
    *,
    model=None,
    n_ctx: int = 128,
    noise_std: float = 0.0,
    split_level: int = 1,
    layer: int = 2,
    reference: str = "aware",
    contexts: int = 500,
    seed: int = 0,
    sweep: PatchingResult | None = None,
    theory_sweep: PatchingResult | None = None,
) -> Explorer:
    """Split level ``m``, layer ``l`` and the theory reference: the key-patching heatmap
    (``(m, l)`` outlined), its row ``m`` for the model and the greedy theory policy, and the
    per-level effect of the patch (:func:`fvlib.interventions.patching.patch_level_effect`).

    Without ``model`` the greedy theory policy of depth ``n_layers`` (default ``K``) on a
    depth-4 tree is patched; with a trained ``model`` its keys are patched and the theory
    policy of the same depth is shown beside it. The theory policy is aware or unaware of the
    patch (``reference``, one of :data:`~fvlib.theory.patching_policies.PATCHING_REFERENCES`; a
    toggle switches it). ``sweep`` reuses a model sweep already computed and ``theory_sweep`` a
    theory sweep of that ``reference`` (same ``tree``, ``n_ctx``, ``noise_std``, depth, pairs);
    otherwise the sweeps use ``contexts`` pairs per split level. ``summary`` holds
    ``split_level``, ``layer``, ``ratio`` (of the shown cell), ``row``, ``target_overlap`` and
    ``donor_overlap`` (``(K,)`` lists). The static page shows the starting ``reference``.
    """
    tree = TreePrior(4, 0.5) if tree is None else tree
    check_tree_prior("tree", tree)
    n_layers = model.config.n_layers if model is not None else (tree.depth if n_layers is None else n_layers)
    check_int("n_layers", n_layers, 1, 64)
    check_int("split_level", split_level, 1, tree.depth)
    check_int("layer", layer, 1, n_layers)
    check_int("contexts", contexts, 2, 100_000)
    check_reference(reference)
    shown = {}
    if model is not None:
        shown["model"] = sweep if sweep is not None else key_patching_sweep(
            model, tree, n_ctx, noise_std, contexts=contexts, seed=seed)
    shown["theory"] = theory_sweep if theory_sweep is not None else theory_patching_sweep(
        tree, n_ctx, noise_std, n_layers, contexts=contexts, seed=seed, reference=reference)
    sweeps = {reference: shown}
    controls = {
        "split_level": slider(widgets.IntSlider, split_level, 1, tree.depth, 1, "split level m"),
        "layer": slider(widgets.IntSlider, layer, 1, n_layers, 1, "patched layer l"),
        "reference": widgets.ToggleButtons(options=PATCHING_REFERENCES, value=reference, description="theory"),
    }
    draw, compute = _patching_drawer(tree, n_ctx, noise_std, n_layers, model, sweeps, contexts, seed)
    source = "trained model" if model is not None else f"greedy theory policy ({reference} of the patch)"

    def live() -> LiveSpec:
        return patching_live(tree, n_layers, split_level, layer, shown,
                             lambda split_level, layer: compute(split_level, layer, reference), source=source,
                             contexts=contexts, seed=seed)

    return Explorer("Patching explorer: where routing happens", controls, draw, live=live)
