"""Causal interventions and probes on the standard transformers (chapter 11, *Standard
transformers*), on the very donor/target pairs of chapter 10 (:func:`fvlib.patching.patching_pairs`).

A standard transformer has no ``theta_hat``: its prediction need not be linear in ``x_q``. The
interventions read it through its **linear part**: for each context, the least-squares fit
``theta_eff = argmin_t sum_q (f(x_q) - <t, x_q>)^2`` over ``queries`` probe queries
``x_q ~ N(0, I_D)`` (:func:`effective_theta`). For a prediction linear in ``x_q`` this is the
``theta_hat`` itself; in general ``E(f(x_q) - <theta, x_q>)^2 = |theta_eff - theta|^2`` plus a
part that does not depend on ``theta``, so the losses below are those of chapter 10 with
``theta_eff`` for ``theta_hat``.

* :func:`transplant_stream` -- the function-vector transplant: replace the target's
  *workspace* after layer ``l`` (bottlenecked arrangement, ``blocks.{l}.hook_workspace``) or
  its *query streams* after layer ``l`` (open arrangement, ``blocks.{l}.hook_query``; donor
  and target share the query inputs) by the donor's, and score ``theta_eff`` level by level
  against both paths (:func:`fvlib.patching.level_overlap`).
* :func:`probe_stream` -- probes (linear or a small MLP, those of chapter 9) reading the path
  signs ``s_k`` from the same streams (the open arrangement: the stream of one query token).
* :func:`attention_spread` -- uniform pooling or retrieval? The entropy and the peak of the
  attention over the context tokens (the workspace's in the bottlenecked arrangement, the
  query token's in the open one).
* :func:`state_patching_sweep` -- the key-patching analogue, bottlenecked arrangement only.
  What context token ``i`` sends at layer ``l`` is its key ``k_i`` and its rank-``d`` value
  ``v_i``, both functions of its stream, i.e. of its own ``(x_i, y_i)`` and of the states
  ``phi_1..phi_{l-1}`` it has read from the workspace. The patch recomputes them with the
  target's own tokens (its labels kept) but the *donor's* workspace read at layers ``1..l-1``,
  and lets the target's workspace pool those at layer ``l``; everything else is the target's.
  In the constrained models the keys are exactly "what a token sends as a function of the
  state" (its labels enter only through the pooling), so this is chapter 10's key patching
  with the state made explicit; at ``l = 1`` there is no state yet and the patch is the
  identity. The open arrangement has no separate state (context tokens read each other), so
  it has no such analogue and the function raises ``ValueError``. ``kind="query"`` patches the
  other side of the pooling: the workspace's query at layer ``l``, the donor's.

Conventions as in :mod:`fvlib.patching`: layers ``l = 1..L`` in column ``l - 1``, split levels
``m = 1..K`` in row ``m - 1``; the same ``seed`` draws the same pairs as
:func:`fvlib.patching.key_patching_sweep` and :func:`fvlib.patching.theory_patching_sweep`
(the probe queries come from a separate generator seeded with ``seed + PROBE_QUERY_SEED_OFFSET``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._checks import check_int
from .patching import (
    DEFAULT_CHUNK,
    PROBE_KINDS,
    PatchingResult,
    ProbeResult,
    TransplantResult,
    _check_tree,
    _chunks,
    _model_device,
    _probe_accuracies,
    _replace_with,
    _run_sweep,
    level_overlap,
    patching_pairs,
)
from .priors import Prior, TreePrior
from .task import TaskBatch, make_generator, sample_task
from .hooks import hook_name
from .transformer import StandardTransformer

__all__ = [
    "PROBE_QUERY_SEED_OFFSET",
    "effective_theta",
    "stream_hook",
    "transplant_stream",
    "probe_stream",
    "AttentionSpread",
    "attention_spread",
    "STATE_PATCH_KINDS",
    "state_patching_sweep",
]

#: The probe queries of a call with ``seed`` are drawn with ``seed + PROBE_QUERY_SEED_OFFSET``.
PROBE_QUERY_SEED_OFFSET = 77_777


def _check_model(model) -> StandardTransformer:
    if not isinstance(model, StandardTransformer):
        raise ValueError(f"model must be a StandardTransformer, got {type(model).__name__}")
    return model


def stream_hook(model: StandardTransformer, layer: int) -> str:
    """The hook name of the stream the transplant replaces and the probes read at ``layer``:
    ``blocks.{l}.hook_workspace`` (bottlenecked, ``(B, D_m)``) or ``blocks.{l}.hook_query``
    (open, ``(B, Q, D_m)``)."""
    _check_model(model)
    check_int("layer", layer, 1, model.config.n_layers)
    kind = "workspace" if model.config.arrangement == "bottlenecked" else "query"
    return hook_name(kind, layer)


def _probe_queries(batch: TaskBatch, queries: int, generator: torch.Generator) -> torch.Tensor:
    """``(B, Q, D)`` standard normal probe queries, drawn on the CPU."""
    B, _, D = batch.x.shape
    return torch.randn(B, queries, D, generator=generator, dtype=batch.x.dtype)


@torch.no_grad()
def effective_theta(
    model: StandardTransformer, batch: TaskBatch, x_probe: torch.Tensor, fwd_hooks=()
) -> torch.Tensor:
    """The linear part of the prediction per context, ``(B, D)`` in float64 on the CPU.

    Runs ``model`` (with ``fwd_hooks``, as in :meth:`~fvlib.models.HookedModel.run_with_hooks`)
    on the context of ``batch`` with the probe queries ``x_probe (B, Q, D)`` (``Q >= D``) and
    solves ``min_t sum_q (f(x_q) - <t, x_q>)^2`` for each context.
    """
    _check_model(model)
    B, _, D = batch.x.shape
    if x_probe.ndim != 3 or x_probe.shape[0] != B or x_probe.shape[-1] != D or x_probe.shape[1] < D:
        raise ValueError(f"x_probe must have shape ({B}, Q, {D}) with Q >= {D}, got {tuple(x_probe.shape)}")
    device = _model_device(model)
    f = model.run_with_hooks(batch.x.to(device), batch.y.to(device), x_probe.to(device), fwd_hooks=fwd_hooks)
    X, f = x_probe.double().cpu(), f.double().cpu()
    return torch.linalg.solve(X.transpose(1, 2) @ X, (X.transpose(1, 2) @ f[..., None]))[..., 0]


def _check_queries(model: StandardTransformer, queries: int) -> int:
    return check_int("queries", queries, model.config.dim)


@torch.no_grad()
def transplant_stream(
    model: StandardTransformer,
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    *,
    split_level: int = 1,
    contexts: int = 2000,
    queries: int = 32,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
) -> TransplantResult:
    """The function-vector transplant at every layer ``l``: the target runs with the donor's
    stream after layer ``l`` (:func:`stream_hook`), and ``theta_eff`` (from ``queries`` probe
    queries shared by donor and target) is scored level by level against both paths.

    Same layout as chapter 10's :func:`fvlib.patching.transplant_workspace`: rows are layers
    ``l = 1..L``, columns tree levels; ``contexts`` pairs split at ``split_level``.
    """
    _check_model(model)
    _check_tree(tree)
    check_int("contexts", contexts, 1)
    _check_queries(model, queries)
    L = model.config.n_layers
    generator, query_gen = make_generator(seed), make_generator(seed + PROBE_QUERY_SEED_OFFSET)
    target_ov, donor_ov, base_ov = [[] for _ in range(L)], [[] for _ in range(L)], []
    device = _model_device(model)
    for size in _chunks(contexts, chunk):
        target, donor = patching_pairs(tree, size, split_level, n_ctx, noise_std, generator)
        x_probe = _probe_queries(target, queries, query_gen)
        names = [stream_hook(model, l) for l in range(1, L + 1)]
        _, donor_cache = model.run_with_cache(
            donor.x.to(device), donor.y.to(device), x_probe.to(device), names_filter=names
        )
        base_ov.append(level_overlap(tree, effective_theta(model, target, x_probe), target.signs))
        for l, name in enumerate(names, start=1):
            theta = effective_theta(model, target, x_probe, [(name, _replace_with(donor_cache[name]))])
            target_ov[l - 1].append(level_overlap(tree, theta, target.signs))
            donor_ov[l - 1].append(level_overlap(tree, theta, donor.signs))
    return TransplantResult(
        target_overlap=torch.stack([torch.cat(rows).mean(0) for rows in target_ov]),
        donor_overlap=torch.stack([torch.cat(rows).mean(0) for rows in donor_ov]),
        baseline_overlap=torch.cat(base_ov).mean(0),
        split_level=split_level,
        n_contexts=contexts,
    )


@torch.no_grad()
def probe_stream(
    model: StandardTransformer,
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    *,
    kind: str = "linear",
    contexts: int = 4000,
    seed: int = 0,
    test_fraction: float = 0.5,
    chunk: int = DEFAULT_CHUNK,
) -> ProbeResult:
    """Probes ``stream after layer l -> s_k`` for every layer ``l`` and tree level ``k``, fitted
    on a train split and scored on a test split (as :func:`fvlib.patching.probe_workspace`).

    The stream is that of :func:`stream_hook`: the workspace ``(B, D_m)`` (bottlenecked) or,
    in the open arrangement, the stream of the context's own query token ``x_q`` (it depends
    on ``x_q`` as well as on the context). ``kind`` is ``'linear'`` or ``'mlp'``.
    """
    _check_model(model)
    _check_tree(tree)
    check_int("contexts", contexts, 1)
    if kind not in PROBE_KINDS:
        raise ValueError(f"kind must be one of {PROBE_KINDS}, got {kind!r}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    n_test = int(round(contexts * test_fraction))
    n_train = contexts - n_test
    if n_train < 2 or n_test < 1:
        raise ValueError(f"contexts={contexts} is too few to split into train and test sets")
    L, K = model.config.n_layers, tree.depth
    device = _model_device(model)
    generator = make_generator(seed)
    names = [stream_hook(model, l) for l in range(1, L + 1)]
    streams, signs = [[] for _ in range(L)], []
    for size in _chunks(contexts, chunk):
        batch = sample_task(tree, size, n_ctx, noise_std, generator).to(device)
        _, cache = model.run_with_cache(batch, names_filter=names)
        for l, name in enumerate(names):
            s = cache[name]
            streams[l].append((s if s.ndim == 2 else s[:, 0]).double().cpu())
        signs.append(batch.signs.cpu())
    labels = torch.cat(signs)
    accuracy = torch.zeros(L, K, dtype=torch.float64)
    for l in range(L):
        features = torch.cat(streams[l])
        accuracy[l] = _probe_accuracies(
            kind, features[:n_train], labels[:n_train], features[n_train:], labels[n_train:], seed
        )
    return ProbeResult(accuracy=accuracy, kind=kind, n_train=n_train, n_test=n_test)


#: What :func:`state_patching_sweep` patches at layer ``l``: what the context tokens send
#: (``"sent"``: keys and values) or what the workspace asks (``"query"``: its pooling query).
STATE_PATCH_KINDS = ("sent", "query")


def _state_patcher(model: StandardTransformer, queries: int, seed: int, kind: str = "sent"):
    """``run_pair(target, donor) -> (clean theta_eff, [theta_eff with the state patch at layer l
    for l = 1..L], target, donor)`` for :func:`fvlib.patching._run_sweep` (module docs)."""
    L = model.config.n_layers
    device = _model_device(model)
    query_gen = make_generator(seed + PROBE_QUERY_SEED_OFFSET)
    workspace = [hook_name("workspace", l) for l in range(1, L + 1)]
    asked = [hook_name("queries", l) for l in range(1, L + 1)]

    def run_pair(target, donor):
        x_probe = _probe_queries(target, queries, query_gen)
        _, donor_cache = model.run_with_cache(donor.to(device), names_filter=workspace + asked)
        patched = []
        for l in range(1, L + 1):
            if kind == "query":  # the workspace pools the target's tokens with the donor's query
                hooks = [(asked[l - 1], _replace_with(donor_cache[asked[l - 1]]))]
                patched.append(effective_theta(model, target, x_probe, hooks))
                continue
            sent = [hook_name("keys", l), hook_name("values", l)]
            donor_state = [(workspace[j], _replace_with(donor_cache[workspace[j]])) for j in range(l - 1)]
            with model.hooks(donor_state):  # the target's tokens, having read the donor's phi_1..phi_{l-1}
                _, hybrid = model.run_with_cache(target.to(device), names_filter=sent)
            hooks = [(name, _replace_with(hybrid[name])) for name in sent]
            patched.append(effective_theta(model, target, x_probe, hooks))
        return effective_theta(model, target, x_probe), patched, target, donor

    return run_pair


@torch.no_grad()
def state_patching_sweep(
    model: StandardTransformer,
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    *,
    contexts: int = 2000,
    queries: int = 32,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
    kind: str = "sent",
) -> PatchingResult:
    """The key-patching analogue (module docs) at every layer ``l`` for every split level ``m``,
    bottlenecked arrangement only: the heatmap ``loss[m - 1, l - 1]`` of
    ``E|theta_eff - theta_target|^2``, on the pairs that
    :func:`fvlib.patching.key_patching_sweep` draws with the same ``seed`` (``contexts`` per
    split level), ``theta_eff`` from ``queries`` probe queries per context.

    ``kind="sent"`` (default) patches what the context tokens send (module docs);
    ``kind="query"`` patches the other side of the pooling instead: the workspace's query at
    layer ``l`` (``blocks.{l}.hook_queries``) becomes the donor's, so the target's workspace
    weights the target's own tokens as the donor's state asks (at ``l = 1`` both start from
    the same learned vector, so this patch too is the identity there).
    """
    if kind not in STATE_PATCH_KINDS:
        raise ValueError(f"kind must be one of {STATE_PATCH_KINDS}, got {kind!r}")
    _check_model(model)
    if model.config.arrangement != "bottlenecked":
        raise ValueError(
            "state patching needs the bottlenecked arrangement (its context tokens read a separate "
            f"workspace state); got arrangement {model.config.arrangement!r}"
        )
    _check_queries(model, queries)
    check_int("seed", seed, 0)
    return _run_sweep(
        tree, model.config.n_layers, n_ctx, noise_std, contexts, seed, chunk,
        _state_patcher(model, queries, seed, kind)
    )


@dataclass
class AttentionSpread:
    """How the attention over the ``N`` context tokens is spread, per layer.

    Attributes:
        entropy: ``(L,)``, mean entropy of the attention weights over the context tokens
            divided by ``log N``: 1 is uniform pooling, 0 is retrieval of one token.
        peak: ``(L,)``, mean of ``N max_i a_i``: 1 is uniform, ``N`` one token.
        patterns: ``(L, n_show, N)``, the weights of the first ``n_show`` contexts, each sorted
            in decreasing order.
        n_contexts: contexts averaged over.
    """

    entropy: torch.Tensor
    peak: torch.Tensor
    patterns: torch.Tensor
    n_contexts: int

    def to_dict(self) -> dict:
        return {
            "entropy": self.entropy.tolist(),
            "peak": self.peak.tolist(),
            "patterns": self.patterns.tolist(),
            "n_contexts": self.n_contexts,
        }


@torch.no_grad()
def attention_spread(
    model: StandardTransformer,
    prior: Prior,
    n_ctx: int,
    noise_std: float,
    *,
    contexts: int = 1000,
    n_show: int = 8,
    seed: int = 0,
) -> AttentionSpread:
    """The attention over the context tokens at every layer, on ``contexts`` fresh contexts of
    ``prior`` drawn with ``seed`` (one query token each): the workspace's pooling weights
    (``blocks.{l}.hook_pattern``, ``(B, 1, N)``) in the bottlenecked arrangement; in the open
    arrangement the query token's row, restricted to the context tokens and renormalised (its
    weight on itself is left out). See :class:`AttentionSpread`.
    """
    _check_model(model)
    check_int("contexts", contexts, 2)
    check_int("n_show", n_show, 1, contexts)
    if n_ctx < 2:
        raise ValueError(f"n_ctx must be at least 2 to speak of spread, got {n_ctx!r}")
    L = model.config.n_layers
    batch = sample_task(prior, contexts, n_ctx, noise_std, make_generator(seed)).to(_model_device(model))
    names = [hook_name("pattern", l) for l in range(1, L + 1)]
    _, cache = model.run_with_cache(batch, names_filter=names)
    entropy, peak, shown = [], [], []
    for name in names:
        a = cache[name].double().cpu()
        a = a[:, 0] if model.config.arrangement == "bottlenecked" else a[:, n_ctx, :n_ctx]
        a = a / a.sum(-1, keepdim=True)
        h = -(a * a.clamp_min(1e-300).log()).sum(-1) / math.log(n_ctx)
        entropy.append(h.mean())
        peak.append((n_ctx * a.max(-1).values).mean())
        shown.append(a[:n_show].sort(-1, descending=True).values)
    return AttentionSpread(torch.stack(entropy), torch.stack(peak), torch.stack(shown), contexts)
