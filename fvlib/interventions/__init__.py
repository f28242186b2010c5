"""Causal interventions and probes on trained models (chapter 9, *Inside the model*; chapter 10,
*Causal interventions*; chapter 11, *Standard transformers*), written once for both model
families and specialised by a read-out of ``theta_hat`` (``predict_theta`` for the constrained
models, ``effective_theta`` for the standard transformers). The donor/target pairs and the sweep
they share with the theory are :mod:`fvlib.theory.patching`; the theory's side of key patching (the
aware and unaware references) is :mod:`fvlib.theory.patching_policies`.

Submodules, in layers from the bottom up; a submodule imports only from the layers below it
(``tests/core/test_import_layers.py`` checks this)::

    readout
        one read-out per model family, the stream a transplant replaces and a probe reads,
        the level-by-level overlap of a prediction with a path
    attention, patching, probes, router, transplant
        attention spread; key patching and state patching (sweeps and their cost, one cell by level, ratios
        and summaries of a heatmap, which theory reference it follows); probes and the workspace's
        principal components; what the gated router measures, beside the theory; the
        function-vector transplant

Every public name of the submodules is importable from ``fvlib.interventions``.
"""

from .attention import AttentionSpread, attention_spread
from .patching import (
    STATE_PATCH_KINDS,
    LevelEffect,
    ReferenceDistances,
    key_patching_sweep,
    pair_patcher,
    patch_keys,
    patch_level_effect,
    patching_cost,
    patching_ratio,
    patching_summary,
    patching_sweep,
    patching_trends,
    reference_distances,
    state_patching_sweep,
)
from .probes import (
    PROBE_KINDS,
    ProbeResult,
    fit_linear_probe,
    fit_mlp_probe,
    probe_accuracy,
    probe_stream,
    probe_workspace,
    run_probes,
    workspace_projections,
)
from .readout import (
    PROBE_QUERY_SEED_OFFSET,
    EffectiveTheta,
    PredictTheta,
    Readout,
    effective_theta,
    level_overlap,
    model_device,
    stream_hook_name,
    workspace_hook_name,
)
from .router import measurement_profile, router_bayes_decode, router_directions, router_policy_alignment
from .transplant import TransplantResult, run_transplant, transplant_stream, transplant_workspace

__all__ = [name for name in dir() if not name.startswith("_")]
