"""Causal interventions and probes on trained models, model side (chapter 10, *Causal
interventions*; chapter 9, *Inside the model*, for the probes).

Donor and target contexts share their inputs ``x_i`` (and query ``x_q``) but come from
different leaves. The *split level* ``m`` (1..K) is the first level at which the two *paths*
visit different nodes: they share the nodes of levels ``0..m-1``; their signs agree on levels
``< m - 1``, differ at level ``m - 1``, and are independent and uniform below. ``m = K`` means
the paths share every internal node and only the last sign (the leaf) differs. See the book's
appendix *Conventions*, section "Donor, target and the split level".

* :func:`key_patching_sweep` -- run the donor, cache its keys at layer ``l``, run the target
  with those keys, measure the target's excess loss; sweep ``(m, l)`` into a heatmap
  ``loss[m - 1, l - 1]``.
* :func:`transplant_workspace` -- replace the target's whole workspace ``Phi_l`` by the
  donor's and measure, level by level, whose ``theta`` the model now predicts.
* :func:`probe_workspace` -- probes (linear or a small MLP) reading the path signs ``s_k``
  from ``Phi_l``.

Conventions: layers ``l = 1..L`` (1-based, as in the hook names ``blocks.{l}``) are stored in
column ``l - 1``; split levels ``m = 1..K`` in row ``m - 1``; tree levels ``k = 0..K-1`` as in
:mod:`fvlib.priors`. In the ideal adaptive model layer ``l`` measures the path node at level
``l - 1``; donor keys at layer ``l`` therefore route the target to its own node when
``l <= m`` (no effect) and to a node off its path when ``l > m``. Without channel noise a later
outcome reveals the skipped sign, so a patch at ``l > m`` costs the greedy policy only
``alpha^(K-1) / 2^(K-l)`` (:func:`noisefree_patching_loss`), more for later patches; with noise
the early patches can cost more (:func:`theory_patching_row` follows one row against ``N``).

:func:`theory_patching_sweep` runs the same intervention on the greedy theory policy, on the
very same donor/target pairs. :func:`patching_ratio` reads a heatmap as ratios to the
unpatched loss of the same targets, and :func:`patching_summary` summarises it after, at and
before the split.

Every intervention takes its arguments in one order: the model (when one is patched), then the
task ``tree, n_ctx, noise_std`` (and the theory policy's depth ``n_layers``), then, by keyword
only, which patch (``split_level``, ``layer``, ``kind``) and the Monte Carlo controls
(``contexts``, ``seed``, ``chunk``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace

import numpy as np
import torch

from ._checks import check_int
from .hooks import hook_name
from .models import FVTransformer
from .priors import TreePrior
from .stats import mean_and_stderr, squared_error
from .task import TaskBatch, check_task_args, make_generator, sample_task
from .theory import FiniteSampleChannel, OptimisedPolicy, channel_tau2, policy_rollout, run_greedy

__all__ = [
    "patching_pairs",
    "donor_signs",
    "patch_keys",
    "PatchingResult",
    "key_patching_sweep",
    "theory_patching_sweep",
    "patching_ratio",
    "patching_summary",
    "TransplantResult",
    "transplant_workspace",
    "ProbeResult",
    "probe_workspace",
    "level_overlap",
    "LevelEffect",
    "patch_level_effect",
    "fit_linear_probe",
    "fit_mlp_probe",
    "probe_accuracy",
]

#: Contexts per forward pass in the sweeps (bounds memory: ``chunk * N * D`` floats).
DEFAULT_CHUNK = 500


# ----------------------------------------------------------------------------------------
# Donor / target pairs
# ----------------------------------------------------------------------------------------
def _check_tree(tree) -> TreePrior:
    if not isinstance(tree, TreePrior):
        raise ValueError(f"patching needs a TreePrior, got {tree!r}")
    return tree


def donor_signs(
    tree: TreePrior, target_signs: torch.Tensor, split_level: int, generator: torch.Generator
) -> torch.Tensor:
    """Donor paths that share the nodes of levels ``< m`` with ``target_signs (B, K)`` and visit a
    different node at level ``m`` (signs equal before ``m - 1``, flipped at ``m - 1``, uniform
    below); shape ``(B, K)``."""
    check_int("split_level", split_level, 1, tree.depth)
    flip = split_level - 1
    fresh = tree.sample_signs(target_signs.shape[0], generator)
    signs = target_signs.clone()
    signs[:, flip] = -target_signs[:, flip]
    signs[:, flip + 1 :] = fresh[:, flip + 1 :]
    return signs


def patching_pairs(
    tree: TreePrior, n_pairs: int, split_level: int, n_ctx: int, noise_std: float, generator: torch.Generator
) -> tuple[TaskBatch, TaskBatch]:
    """``(target, donor)`` batches of ``n_pairs`` contexts sharing ``x (B, N, D)`` and ``x_query``.

    The target leaf is uniform; the donor's path first visits a different node at level
    ``split_level`` (see :func:`donor_signs`).
    Label noise is drawn independently for the two.
    """
    _check_tree(tree)
    check_int("n_pairs", n_pairs, 1)
    target = sample_task(tree, n_pairs, n_ctx, noise_std, generator)
    signs = donor_signs(tree, target.signs, split_level, generator)
    donor = sample_task(tree, n_pairs, n_ctx, noise_std, generator, signs=signs, x=target.x)
    query_noise = donor.y_query - (donor.theta * donor.x_query).sum(-1)
    y_query = (donor.theta * target.x_query).sum(-1) + query_noise
    return target, replace(donor, x_query=target.x_query, y_query=y_query)


# ----------------------------------------------------------------------------------------
# Key patching
# ----------------------------------------------------------------------------------------
def _replace_with(tensor: torch.Tensor):
    def hook(activation, hook_point):
        return tensor

    return hook


def patch_keys(model: FVTransformer, target: TaskBatch, donor_keys: torch.Tensor, layer: int) -> torch.Tensor:
    """``theta_hat (B, D)`` of the target run with its keys at ``layer`` (1-based) replaced by
    ``donor_keys (B, N, d)``."""
    name = hook_name("keys", model.block(layer).layer)
    with model.hooks([(name, _replace_with(donor_keys))]):
        return model.predict_theta(target)


def _sq_error(theta_hat: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Per-context ``|theta_hat - theta|^2`` in float64 on the CPU, shape ``(B,)``."""
    return squared_error(theta_hat.double(), theta.double()).cpu()


def _chunks(total: int, chunk: int) -> list[int]:
    return [min(chunk, total - start) for start in range(0, total, chunk)]


def _model_device(model: FVTransformer) -> torch.device:
    return next(model.parameters()).device


@dataclass
class PatchingResult:
    """Key-patching heatmap.

    Attributes:
        baseline: excess loss of the unpatched targets (all split levels pooled).
        baseline_stderr: its standard error.
        baseline_by_level: ``(K,)``, the unpatched loss on the targets of each split level.
        loss: ``(K, L)`` tensor; ``loss[m - 1, l - 1]`` is the target's excess loss
            ``E|theta_hat - theta_target|^2`` when its keys at layer ``l`` come from a donor
            whose path splits off at level ``m`` (``m = 1..K``).
        stderr: ``(K, L)`` standard errors of ``loss``.
        donor_loss: ``(K, L)``, the same runs scored against the donor's ``theta``.
        n_contexts: donor/target pairs per cell (and per split level for the baseline).
    """

    baseline: float
    baseline_stderr: float
    baseline_by_level: torch.Tensor
    loss: torch.Tensor
    stderr: torch.Tensor
    donor_loss: torch.Tensor
    n_contexts: int

    @property
    def split_levels(self) -> list[int]:
        return list(range(1, self.loss.shape[0] + 1))

    @property
    def layers(self) -> list[int]:
        return list(range(1, self.loss.shape[1] + 1))

    def to_dict(self) -> dict:
        """JSON-ready: ``loss`` rows are split levels ``m = 1..K``, columns layers ``l = 1..L``."""
        return {
            "baseline": self.baseline,
            "baseline_stderr": self.baseline_stderr,
            "baseline_by_level": self.baseline_by_level.tolist(),
            "loss": self.loss.tolist(),
            "stderr": self.stderr.tolist(),
            "donor_loss": self.donor_loss.tolist(),
            "n_contexts": self.n_contexts,
        }


def _run_sweep(tree, n_layers, n_ctx, noise_std, contexts, seed, chunk, run_pair) -> PatchingResult:
    """Draw ``contexts`` donor/target pairs per split level ``m = 1..K`` (seeded, chunked) and
    score ``run_pair(target, donor) -> (clean theta_hat, [patched theta_hat per layer], target,
    donor)`` (see :func:`_model_patcher`, :func:`_theory_patcher`); shared by the model and
    theory sweeps so both see the same pairs."""
    _check_tree(tree)
    check_int("contexts", contexts, 1)
    K, L = tree.depth, n_layers
    generator = make_generator(seed)
    baseline = [[] for _ in range(K)]
    target_err = [[[] for _ in range(L)] for _ in range(K)]
    donor_err = [[[] for _ in range(L)] for _ in range(K)]
    for row in range(K):
        for size in _chunks(contexts, chunk):
            target, donor = patching_pairs(tree, size, row + 1, n_ctx, noise_std, generator)
            clean, patched, target, donor = run_pair(target, donor)
            baseline[row].append(_sq_error(clean, target.theta))
            for l, theta_hat in enumerate(patched, start=1):
                target_err[row][l - 1].append(_sq_error(theta_hat, target.theta))
                donor_err[row][l - 1].append(_sq_error(theta_hat, donor.theta))
    return _collect_sweep(baseline, target_err, donor_err, contexts)


def _collect_sweep(baseline, target_err, donor_err, contexts: int) -> PatchingResult:
    """Assemble a :class:`PatchingResult` from per-chunk squared errors.

    ``baseline[row]`` and ``target_err[row][l - 1]`` / ``donor_err[row][l - 1]`` are lists of
    ``(chunk,)`` tensors for split level ``m = row + 1`` and layer ``l``.
    """
    errors = torch.stack([torch.stack([torch.cat(cell) for cell in row]) for row in target_err])  # (K, L, n)
    donor_errors = torch.stack([torch.stack([torch.cat(cell) for cell in row]) for row in donor_err])
    loss, stderr = mean_and_stderr(errors)
    baseline_errors = torch.stack([torch.cat(level) for level in baseline])  # (K, n)
    base_mean, base_stderr = mean_and_stderr(baseline_errors.flatten())
    return PatchingResult(
        baseline=float(base_mean),
        baseline_stderr=float(base_stderr),
        baseline_by_level=baseline_errors.mean(-1),
        loss=loss,
        stderr=stderr,
        donor_loss=donor_errors.mean(-1),
        n_contexts=contexts,
    )


@torch.no_grad()
def key_patching_sweep(
    model: FVTransformer,
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    *,
    contexts: int = 2000,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
) -> PatchingResult:
    """Patch donor keys into the target at every layer ``l`` for every split level ``m``.

    ``contexts`` donor/target pairs per split level (the same pairs for every layer), drawn
    with ``seed``. See :class:`PatchingResult` for the layout.
    """
    layers = range(1, model.config.n_layers + 1)
    return _run_sweep(tree, model.config.n_layers, n_ctx, noise_std, contexts, seed, chunk, _model_patcher(model, layers))


def theory_patching_sweep(
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    n_layers: int,
    *,
    contexts: int = 2000,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
    policy=None,
) -> PatchingResult:
    """The key-patching heatmap of a theory policy (greedy by default), on the same pairs as the model's.

    Each layer of the policy measures one node from the context's statistic
    ``g_hat = (1/N) sum_i y_i x_i`` and decodes with the exact posterior. The donor's "keys" at
    layer ``l`` are the node it measures there; patching makes the target measure the donor's
    node at layer ``l`` (its own ``y_i`` are pooled), after which the target follows its own
    greedy policy. Pairs are drawn exactly as in :func:`key_patching_sweep` with the same
    ``seed``, so the two heatmaps compare the same contexts. ``n_layers`` is the policy's depth
    (the model's ``L``).

    ``policy``: another direction policy instead of greedy, e.g. the optimised adaptive policy
    (an :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`, or anything
    :func:`~fvlib.theory.adaptive_opt.policy_rollout` runs). Its "keys" at layer ``l`` are the
    direction it measures there: the target measures the donor's layer-``l`` direction and then
    follows its own policy, decoded exactly.
    """
    check_int("n_layers", n_layers, 1)
    tau2 = channel_tau2(tree, n_ctx, noise_std)
    layers = range(1, n_layers + 1)
    if policy is None:
        patcher = _theory_patcher(tree, n_layers, tau2, layers)
    else:
        patcher = _policy_patcher(tree, n_layers, tau2, layers, policy)
    return _run_sweep(tree, n_layers, n_ctx, noise_std, contexts, seed, chunk, patcher)


def _model_patcher(model: FVTransformer, layers):
    """``run_pair(target, donor) -> (clean theta_hat, [theta_hat with the donor's keys at layer l,
    for l in layers], target, donor)``, the batches moved to the model's device."""
    device = _model_device(model)

    def run_pair(target, donor):
        target, donor = target.to(device), donor.to(device)
        _, donor_cache = model.run_with_cache(donor, names_filter=hook_name("keys", "*"))
        patched = [patch_keys(model, target, donor_cache[hook_name("keys", l)], l) for l in layers]
        return model.predict_theta(target), patched, target, donor

    return run_pair


def _theory_patcher(tree: TreePrior, n_layers: int, tau2: float, layers):
    """The same for the greedy theory policy of depth ``n_layers``: "keys" at layer ``l`` are the
    node measured there, so the target is forced to measure the donor's layer-``l`` node."""

    def run_pair(target, donor):
        target_chan = FiniteSampleChannel(target.to("cpu", torch.float64).sufficient_statistic())
        donor_chan = FiniteSampleChannel(donor.to("cpu", torch.float64).sufficient_statistic())
        donor_nodes = run_greedy(tree, donor_chan, n_layers, tau2).nodes
        clean = run_greedy(tree, target_chan, n_layers, tau2).theta_hat
        patched = [
            run_greedy(tree, target_chan, n_layers, tau2, forced={l: donor_nodes[:, l - 1]}).theta_hat
            for l in layers
        ]
        return clean, patched, target, donor

    return run_pair


def _policy_patcher(tree: TreePrior, n_layers: int, tau2: float, layers, policy):
    """The same for any direction policy: "keys" at layer ``l`` are the direction measured there."""
    rule = policy.policy if isinstance(policy, OptimisedPolicy) else policy

    def run_pair(target, donor):
        target_chan = FiniteSampleChannel(target.to("cpu", torch.float64).sufficient_statistic())
        donor_chan = FiniteSampleChannel(donor.to("cpu", torch.float64).sufficient_statistic())
        with torch.no_grad():
            donor_rows = policy_rollout(tree, rule, donor_chan, n_layers, tau2).directions
            clean = policy_rollout(tree, rule, target_chan, n_layers, tau2).theta_hat
            patched = [
                policy_rollout(tree, rule, target_chan, n_layers, tau2, forced={l: donor_rows[:, l - 1]}).theta_hat
                for l in layers
            ]
        return clean, patched, target, donor

    return run_pair


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


# ----------------------------------------------------------------------------------------
# Workspace transplant
# ----------------------------------------------------------------------------------------
def level_overlap(tree: TreePrior, theta_hat: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """Per level ``k``, the fraction of the path coefficient that ``theta_hat`` recovers:
    ``theta_hat[n_k] s_k / alpha^(k/2)`` at the path node ``n_k`` of ``signs``.

    ``theta_hat (B, D)``, ``signs (B, K)`` -> ``(B, K)``; 1 means that level of this path is
    predicted exactly, 0 that the model puts nothing there.
    """
    nodes = tree.path_nodes(signs.cpu())
    values = theta_hat.double().cpu().gather(-1, nodes)
    return values * signs.cpu().double() / tree.level_scales


@dataclass
class TransplantResult:
    """Whose ``theta`` the model predicts after the target's ``Phi_l`` is replaced by the donor's.

    Attributes:
        target_overlap: ``(L, K)``; row ``l - 1`` (workspace ``Phi_l`` transplanted), column
            ``k``: mean :func:`level_overlap` of ``theta_hat`` with the target's path at level
            ``k`` (1 = the model predicts the target there).
        donor_overlap: ``(L, K)``, the same with the donor's path.
        baseline_overlap: ``(K,)``, overlap of the unpatched prediction with the target.
        split_level: where donor and target paths split (levels below it are shared, so
            their overlaps coincide there).
        n_contexts: pairs per cell.
    """

    target_overlap: torch.Tensor
    donor_overlap: torch.Tensor
    baseline_overlap: torch.Tensor
    split_level: int
    n_contexts: int

    def to_dict(self) -> dict:
        return {
            "target_overlap": self.target_overlap.tolist(),
            "donor_overlap": self.donor_overlap.tolist(),
            "baseline_overlap": self.baseline_overlap.tolist(),
            "split_level": self.split_level,
            "n_contexts": self.n_contexts,
        }


@torch.no_grad()
def transplant_workspace(
    model: FVTransformer,
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    *,
    split_level: int = 1,
    contexts: int = 2000,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
) -> TransplantResult:
    """Replace the target's workspace ``Phi_l`` (``blocks.{l}.hook_workspace``) by the donor's,
    for every layer ``l``, and score the prediction against both paths level by level.

    With the default ``split_level=1`` the two paths share only the root node (with opposite
    signs), so each level's overlap says cleanly whose coefficient the model outputs.
    """
    _check_tree(tree)
    check_int("contexts", contexts, 1)
    L = model.config.n_layers
    device = _model_device(model)
    generator = make_generator(seed)
    target_ov, donor_ov, base_ov = [[] for _ in range(L)], [[] for _ in range(L)], []
    for size in _chunks(contexts, chunk):
        target, donor = (
            b.to(device) for b in patching_pairs(tree, size, split_level, n_ctx, noise_std, generator)
        )
        _, donor_cache = model.run_with_cache(donor, names_filter=hook_name("workspace", "*"))
        base_ov.append(level_overlap(tree, model.predict_theta(target), target.signs))
        for l in range(1, L + 1):
            name = hook_name("workspace", l)
            with model.hooks([(name, _replace_with(donor_cache[name]))]):
                theta_hat = model.predict_theta(target)
            target_ov[l - 1].append(level_overlap(tree, theta_hat, target.signs))
            donor_ov[l - 1].append(level_overlap(tree, theta_hat, donor.signs))
    return TransplantResult(
        target_overlap=torch.stack([torch.cat(rows).mean(0) for rows in target_ov]),
        donor_overlap=torch.stack([torch.cat(rows).mean(0) for rows in donor_ov]),
        baseline_overlap=torch.cat(base_ov).mean(0),
        split_level=split_level,
        n_contexts=contexts,
    )


@dataclass
class LevelEffect:
    """What one key patch (split level ``m``, layer ``l``) does to each level of the prediction.

    Attributes:
        target: ``(K,)``, mean :func:`level_overlap` of the patched prediction with the
            target's path at each tree level ``k`` (1 = the target's coefficient is recovered).
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
) -> LevelEffect:
    """Key-patch layer ``layer`` with donors that split off at ``split_level`` and score the
    prediction level by level (one cell of the sweep, resolved by tree level).

    With ``model`` the trained model is patched (as in :func:`key_patching_sweep`); without it
    the greedy theory policy of depth ``n_layers`` (as in :func:`theory_patching_sweep`).
    ``contexts`` pairs drawn with ``seed``.
    """
    _check_tree(tree)
    check_int("contexts", contexts, 1)
    depth = model.config.n_layers if model is not None else check_int("n_layers", n_layers, 1)
    check_int("layer", layer, 1, depth)
    run_pair = (
        _model_patcher(model, [layer])
        if model is not None
        else _theory_patcher(tree, depth, channel_tau2(tree, n_ctx, noise_std), [layer])
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


# ----------------------------------------------------------------------------------------
# Linear probes
# ----------------------------------------------------------------------------------------
def fit_linear_probe(features: torch.Tensor, labels: torch.Tensor, ridge: float = 1e-6) -> torch.Tensor:
    """Least-squares probes with a bias: ``features (n, f)``, labels ``(n,)`` or ``(n, k)`` in
    {-1, +1} -> weights ``(f + 1,)`` or ``(f + 1, k)`` (last row the bias); float64."""
    X = torch.cat([features.double(), torch.ones(features.shape[0], 1, dtype=torch.float64)], dim=1)
    gram = X.T @ X + ridge * X.shape[0] * torch.eye(X.shape[1], dtype=torch.float64)
    return torch.linalg.solve(gram, X.T @ labels.double())


def probe_accuracy(weights: torch.Tensor, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Fraction of ``labels`` (+-1, ``(n,)`` or ``(n, k)``) whose sign the probe gets right,
    per column."""
    scores = features.double() @ weights[:-1] + weights[-1]
    return ((scores > 0) == (labels > 0)).double().mean(0)


def fit_mlp_probe(
    features: torch.Tensor, labels: torch.Tensor, hidden: int = 32, steps: int = 200, seed: int = 0
) -> torch.nn.Module:
    """Small nonlinear probe reading all ``k`` labels at once.

    Standardised features ``(n, f)`` -> GELU MLP -> ``k`` scores, logistic loss against
    labels ``(n, k)`` in {-1, +1}, full-batch Adam; deterministic for a given ``seed``.
    Returns a module mapping features ``(n, f)`` to scores ``(n, k)`` (positive means +1).
    """
    features, labels = features.double(), labels.double().reshape(features.shape[0], -1)
    mean, std = features.mean(0), features.std(0).clamp_min(1e-12)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(
            torch.nn.Linear(features.shape[1], hidden),
            torch.nn.GELU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.GELU(),
            torch.nn.Linear(hidden, labels.shape[1]),
        ).double()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    inputs = (features - mean) / std
    with torch.enable_grad():
        for _ in range(steps):
            loss = torch.nn.functional.softplus(-labels * net(inputs)).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    net.requires_grad_(False)
    return torch.nn.Sequential(_Standardise(mean, std), net)


class _Standardise(torch.nn.Module):
    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.double() - self.mean) / self.std


PROBE_KINDS = ("linear", "mlp")


@dataclass
class ProbeResult:
    """Decodability of the path from the workspace.

    Attributes:
        accuracy: ``(L, K)``; row ``l - 1``, column ``k``: test accuracy of a probe reading the
            sign ``s_k`` from ``Phi_l`` (0.5 = chance).
        kind: ``'linear'`` (least squares) or ``'mlp'`` (small nonlinear probe).
        n_train, n_test: contexts used to fit and to score the probes.
    """

    accuracy: torch.Tensor
    kind: str
    n_train: int
    n_test: int

    def to_dict(self) -> dict:
        return {
            "accuracy": self.accuracy.tolist(),
            "kind": self.kind,
            "n_train": self.n_train,
            "n_test": self.n_test,
        }


def _probe_accuracies(kind: str, train_x, train_y, test_x, test_y, seed: int) -> torch.Tensor:
    """Test accuracy per label column, ``(k,)``."""
    if kind == "linear":
        return probe_accuracy(fit_linear_probe(train_x, train_y), test_x, test_y)
    probe = fit_mlp_probe(train_x, train_y, seed=seed)
    return ((probe(test_x) > 0) == (test_y > 0)).double().mean(0)


@torch.no_grad()
def probe_workspace(
    model: FVTransformer,
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
    """Fit probes ``Phi_l -> s_k`` on a train split and score them on a test split, for every
    layer ``l`` and level ``k``.

    ``kind='linear'``: closed-form least squares (with a bias) on the +-1 labels. A linear
    probe only sees signs stored with a fixed orientation; a model may store finer levels
    with a path-dependent orientation (measuring ``-e_n`` on one branch, ``+e_n`` on the
    other), which ``kind='mlp'`` still reads: one small MLP per layer with ``K`` outputs,
    see :func:`fit_mlp_probe`.
    """
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
    workspaces, signs = [[] for _ in range(L)], []
    for size in _chunks(contexts, chunk):
        batch = sample_task(tree, size, n_ctx, noise_std, generator).to(device)
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", "*"))
        for l in range(1, L + 1):
            workspaces[l - 1].append(cache[hook_name("workspace", l)].cpu())
        signs.append(batch.signs.cpu())
    labels = torch.cat(signs)
    accuracy = torch.zeros(L, K, dtype=torch.float64)
    for l in range(L):
        features = torch.cat(workspaces[l])
        accuracy[l] = _probe_accuracies(
            kind, features[:n_train], labels[:n_train], features[n_train:], labels[n_train:], seed
        )
    return ProbeResult(accuracy=accuracy, kind=kind, n_train=n_train, n_test=n_test)


# ----------------------------------------------------------------------------------------
# The noise-free pattern and one heatmap row against the context length
# ----------------------------------------------------------------------------------------

def noisefree_patching_loss(tree: TreePrior, split_level: int, n_layers: int) -> torch.Tensor:
    """Expected patched loss of the greedy policy in the noise-free limit (``tau -> 0``).

    Row ``m = split_level`` of the key-patching heatmap, ``(L,)`` float64, column ``l - 1``
    for layer ``l``, when the policy has one layer per tree level (``L = K``). A patch at
    ``l <= m`` changes nothing (loss 0, the unpatched loss). A patch at ``l > m`` wastes
    layer ``l``'s measurement; each later layer measures one child of the node it believes
    is on the path, and its outcome (the child's coefficient, or zero) reveals the sign left
    open, so only the finest level can stay unknown, with probability ``2^-(K - l)``:
    the loss is ``alpha^(K-1) / 2^(K-l)``, whatever ``m < l``. Exact for the greedy rule with a
    tie-break that does not depend on the unknown sign (fvlib's ``argmax`` takes the first).
    The chapter on causal interventions states and proves it (``prop-interventions-ideal``).
    """
    _check_tree(tree)
    K = tree.depth
    check_int("split_level", split_level, 1, K)
    check_int("n_layers", n_layers, 1)
    if n_layers != K:
        raise ValueError(f"the noise-free pattern is derived for n_layers = K = {K}, got {n_layers!r}")
    layers = torch.arange(1, K + 1, dtype=torch.float64)
    loss = tree.alpha ** (K - 1) * 2.0 ** (layers - K)
    return torch.where(layers > split_level, loss, torch.zeros_like(loss))


def sample_pair_statistics(
    theta_target: torch.Tensor,
    theta_donor: torch.Tensor,
    n_ctx: int,
    noise_std: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw the statistics ``g_hat = (1/N) sum_i y_i x_i`` of a target and a donor that share
    their inputs ``x_i ~ N(0, I_D)``, exactly and in ``O(N + D)`` per pair.

    ``y_i = <theta_target, x_i> + sigma eps_i`` and ``y'_i = <theta_donor, x_i> + sigma eps'_i``
    with independent label noise (as in :func:`patching_pairs`). With an orthonormal basis
    ``u_1, u_2`` of the span of the two latents, the coordinates ``a_i, b_i`` of ``x_i`` on it
    carry all the dependence on ``y``; the rest of ``x_i`` is independent, so the two
    orthogonal parts are jointly Gaussian with covariance
    ``[[S_yy, S_yy'], [S_yy', S_y'y']] (x) P_perp / N^2``. All the sums over tokens are
    quadratic forms in the Gram matrix of ``(a_i, b_i, eps_i, eps'_i)`` (of ``(a_i, b_i)`` when
    ``sigma = 0``), which is accumulated over the tokens. Same law as the explicit sums, without
    drawing ``N x D`` inputs (use it for long contexts).

    Args:
        theta_target, theta_donor: ``(B, D)`` latents (float64), non-zero.
    Returns:
        ``(g_target, g_donor)``, each ``(B, D)`` float64.
    """
    check_task_args(n_ctx, noise_std)
    theta_t = torch.as_tensor(theta_target, dtype=torch.float64)
    theta_d = torch.as_tensor(theta_donor, dtype=torch.float64)
    if theta_t.ndim != 2 or theta_t.shape != theta_d.shape:
        raise ValueError(
            f"theta_target and theta_donor must both have shape (B, D), got "
            f"{tuple(theta_t.shape)} and {tuple(theta_d.shape)}"
        )
    B, D = theta_t.shape
    norm_t = theta_t.norm(dim=-1, keepdim=True)
    if not bool((norm_t > 0).all()):
        raise ValueError("theta_target must be non-zero in every row")
    u1 = theta_t / norm_t
    d1 = (theta_d * u1).sum(-1, keepdim=True)
    rest = theta_d - d1 * u1
    rest_norm = rest.norm(dim=-1, keepdim=True)
    if D == 1:
        u2 = torch.zeros_like(u1)
    else:  # any unit vector orthogonal to u1 where the donor is parallel to the target
        e = torch.zeros_like(u1).scatter_(-1, u1.abs().argmin(-1, keepdim=True), 1.0)
        fallback = e - (e * u1).sum(-1, keepdim=True) * u1
        fallback = fallback / fallback.norm(dim=-1, keepdim=True)
        parallel = rest_norm <= 1e-12 * theta_d.norm(dim=-1, keepdim=True)
        u2 = torch.where(parallel, fallback, rest / rest_norm.clamp_min(1e-300))
    d2 = (theta_d * u2).sum(-1, keepdim=True)
    # Per token, y_i and y'_i are linear in v_i = (a_i, b_i, eps_i, eps'_i) ~ N(0, I_p) (only
    # (a_i, b_i) when sigma = 0): every sum below is a quadratic form in G = sum_i v_i v_i^T.
    p = 2 if noise_std == 0 else 4
    zero = torch.zeros_like(d1)
    c_t = torch.cat([norm_t, zero, zero + noise_std, zero], dim=-1)[:, :p, None]  # (B, p, 1)
    c_d = torch.cat([d1, d2, zero, zero + noise_std], dim=-1)[:, :p, None]
    gram = torch.zeros(B, p, p, dtype=torch.float64)
    chunk = max(1, (1 << 22) // (B * p))
    for start in range(0, n_ctx, chunk):
        width = min(chunk, n_ctx - start)
        v = torch.randn(B, width, p, generator=generator, dtype=torch.float64)
        gram += v.transpose(1, 2) @ v
    g_ct, g_cd = gram @ c_t, gram @ c_d  # (B, p, 1)
    s_ay, s_by, s_ay2, s_by2 = g_ct[:, 0], g_ct[:, 1], g_cd[:, 0], g_cd[:, 1]  # (B, 1) each
    s_yy = (c_t * g_ct).sum(1)
    s_yy2 = (c_t * g_cd).sum(1)
    s_y2y2 = (c_d * g_cd).sum(1)
    z1, z2 = torch.randn(2, B, D, generator=generator, dtype=torch.float64)

    def perp(z):
        return z - (z * u1).sum(-1, keepdim=True) * u1 - (z * u2).sum(-1, keepdim=True) * u2

    z1, z2 = perp(z1), perp(z2)
    root = s_yy.sqrt()
    cross = s_yy2 / root.clamp_min(1e-300)
    tail = (s_y2y2 - cross**2).clamp_min(0.0).sqrt()
    g_t = (s_ay * u1 + s_by * u2 + root * z1) / n_ctx
    g_d = (s_ay2 * u1 + s_by2 * u2 + cross * z1 + tail * z2) / n_ctx
    return g_t, g_d


@dataclass
class PatchingRow:
    """One row (split level ``m``) of the greedy theory's key-patching heatmap at several
    context lengths ``N``.

    Attributes:
        n_ctx: ``(n,)`` context lengths, increasing.
        loss: ``(n, L)``; ``loss[i, l - 1]`` is the target's excess loss at ``N = n_ctx[i]`` when
            its measured node at layer ``l`` is replaced by the donor's.
        stderr: ``(n, L)`` standard errors of ``loss``.
        step_stderr: ``(n, L - 1)``; column ``l - 1`` is the standard error of
            ``loss[:, l] - loss[:, l - 1]`` (layer ``l + 1`` minus layer ``l``), paired on the
            same targets (usually much smaller than the two cells' errors added).
        baseline: ``(n,)``, the unpatched loss of the same targets; ``baseline_stderr`` its error.
        noisefree: ``(L,)``, :func:`noisefree_patching_loss` (``None`` when ``L != K``).
        split_level, noise_std, n_contexts: the row ``m``, the label noise ``sigma`` and the
            donor/target pairs per context length (the same leaves at every ``N``).
    """

    n_ctx: torch.Tensor
    loss: torch.Tensor
    stderr: torch.Tensor
    step_stderr: torch.Tensor
    baseline: torch.Tensor
    baseline_stderr: torch.Tensor
    noisefree: torch.Tensor | None
    split_level: int
    noise_std: float
    n_contexts: int

    @property
    def ratio(self) -> torch.Tensor:
        """``(n, L)`` patched over unpatched loss (the heatmap's ratio)."""
        return self.loss / self.baseline[:, None]

    def to_dict(self) -> dict:
        return {
            "n_ctx": self.n_ctx.tolist(),
            "loss": self.loss.tolist(),
            "stderr": self.stderr.tolist(),
            "step_stderr": self.step_stderr.tolist(),
            "baseline": self.baseline.tolist(),
            "baseline_stderr": self.baseline_stderr.tolist(),
            "noisefree": None if self.noisefree is None else self.noisefree.tolist(),
            "split_level": self.split_level,
            "noise_std": self.noise_std,
            "n_contexts": self.n_contexts,
        }


def _check_n_ctx_values(n_ctx_values) -> list[int]:
    """Context lengths as a list of positive, strictly increasing integers."""
    message = f"n_ctx_values must be a non-empty increasing sequence of positive integers, got {n_ctx_values!r}"
    try:
        values = [operator.index(n) for n in n_ctx_values]
    except TypeError:
        raise ValueError(message) from None
    if (not values or any(isinstance(n, bool) for n in n_ctx_values) or values[0] < 1
            or any(b <= a for a, b in zip(values, values[1:]))):
        raise ValueError(message)
    return values


def theory_patching_row(
    tree: TreePrior,
    n_ctx_values,
    noise_std: float,
    n_layers: int,
    *,
    split_level: int = 1,
    contexts: int = 200,
    seed: int = 0,
) -> PatchingRow:
    """Row ``m = split_level`` of :func:`theory_patching_sweep` at every ``N`` in ``n_ctx_values``.

    ``contexts`` donor/target leaf pairs (split at ``split_level``, drawn once with ``seed``
    and reused at every ``N``); for each ``N`` their statistics come from
    :func:`sample_pair_statistics` (shared inputs, so long contexts cost ``O(N)`` per pair),
    the donor's greedy rollout gives its nodes, and the target is rerun with the donor's node
    forced at each layer ``l``, exactly as in :func:`theory_patching_sweep` (whose pairs it
    does not reproduce: the random streams differ).
    """
    _check_tree(tree)
    check_int("contexts", contexts, 1)
    check_int("n_layers", n_layers, 1)
    values = _check_n_ctx_values(n_ctx_values)
    generator = make_generator(seed)
    target_signs = tree.sample_signs(contexts, generator)
    donor = donor_signs(tree, target_signs, split_level, generator)
    theta_t, theta_d = tree.theta_from_signs(target_signs), tree.theta_from_signs(donor)
    losses, errors, steps, bases, base_errors = [], [], [], [], []
    for i, n in enumerate(values):
        g_t, g_d = sample_pair_statistics(theta_t, theta_d, n, noise_std, make_generator(seed + 1 + i))
        tau2 = channel_tau2(tree, n, noise_std)
        target_chan, donor_chan = FiniteSampleChannel(g_t), FiniteSampleChannel(g_d)
        donor_nodes = run_greedy(tree, donor_chan, n_layers, tau2).nodes
        clean = run_greedy(tree, target_chan, n_layers, tau2).theta_hat
        patched = torch.stack([
            _sq_error(run_greedy(tree, target_chan, n_layers, tau2, forced={l: donor_nodes[:, l - 1]}).theta_hat,
                      theta_t)
            for l in range(1, n_layers + 1)
        ])  # (L, B)
        mean, err = mean_and_stderr(patched)
        base, base_err = mean_and_stderr(_sq_error(clean, theta_t))
        losses.append(mean), errors.append(err), bases.append(base), base_errors.append(base_err)
        steps.append(mean_and_stderr(patched[1:] - patched[:-1])[1])
    return PatchingRow(
        n_ctx=torch.tensor(values),
        loss=torch.stack(losses),
        stderr=torch.stack(errors),
        step_stderr=torch.stack(steps),
        baseline=torch.stack(bases),
        baseline_stderr=torch.stack(base_errors),
        noisefree=noisefree_patching_loss(tree, split_level, n_layers) if n_layers == tree.depth else None,
        split_level=split_level,
        noise_std=float(noise_std),
        n_contexts=contexts,
    )


__all__ += ["noisefree_patching_loss", "sample_pair_statistics", "PatchingRow", "theory_patching_row"]
