"""The theory of key patching (chapter 10, *Causal interventions*): donor and target contexts,
the sweep that scores a patch on every split level and layer, and the noise-free pattern. The
theory policies patched as the models are (the *aware* and *unaware* references) are in
:mod:`fvlib.theory.patching_policies`.

Donor and target contexts share their inputs ``x_i`` (and query ``x_q``) but come from
different leaves. The *split level* ``m`` (1..K) is the first level at which the two *paths*
visit different nodes: they share the nodes of levels ``0..m-1``; their signs agree on levels
``< m - 1``, differ at level ``m - 1``, and are independent and uniform below. ``m = K`` means
the paths share every internal node and only the last sign (the leaf) differs. See the book's
appendix *Conventions*, section "Donor, target and the split level".

* :func:`patching_pairs` -- the donor/target pairs (:func:`donor_signs` draws the donor's path);
* :func:`run_patching_sweep` -- draws the pairs of every split level (seeded, chunked) and
  scores a patcher on them into a :class:`PatchingResult`; the models' sweeps
  (:mod:`fvlib.interventions`) and :func:`fvlib.theory.patching_policies.theory_patching_sweep`
  share it, so both see the very same pairs;
* :func:`ideal_patching_mask` -- the ideal pattern: the patch changes what the target measures
  exactly when ``l > m``;
* :func:`noisefree_patching_loss` -- without channel noise a later outcome reveals the skipped
  sign, so a patch at ``l > m`` costs the greedy policy only ``alpha^(K-1) / 2^(K-l)``;
* :func:`sample_pair_statistics` -- the finite-``N`` statistics of a donor and a target that
  share their inputs, in ``O(N + D)`` per pair (one heatmap row against ``N``,
  :func:`fvlib.theory.patching_policies.theory_patching_row`).

Conventions: layers ``l = 1..L`` (1-based, as in the hook names ``blocks.{l}``) are stored in
column ``l - 1``; split levels ``m = 1..K`` in row ``m - 1``; tree levels ``k = 0..K-1`` as in
:mod:`fvlib.priors`. Every sweep takes its arguments in one order: the task ``tree, n_ctx,
noise_std`` (and the theory policy's depth ``n_layers``), then, by keyword only, which patch and
the Monte Carlo controls (``contexts``, ``seed``, ``chunk``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from .._checks import check_int
from ..priors import TreePrior, check_tree_prior
from ..stats import mean_and_stderr, squared_error
from ..task import TaskBatch, check_task_args, make_generator, sample_task

__all__ = [
    "DEFAULT_CHUNK",
    "check_tree",
    "chunk_sizes",
    "donor_signs",
    "patching_pairs",
    "PatchingResult",
    "run_patching_sweep",
    "noisefree_patching_loss",
    "sample_pair_statistics",
    "ideal_patching_mask",
]

#: Contexts per forward pass in the sweeps (it bounds the memory, ``chunk * N * D`` floats).
DEFAULT_CHUNK = 500


# ----------------------------------------------------------------------------------------
# Donor / target pairs
# ----------------------------------------------------------------------------------------
def check_tree(tree) -> TreePrior:
    """``tree`` if it is a tree prior (patching needs paths), else ``ValueError``."""
    return check_tree_prior("tree", tree)


def chunk_sizes(total: int, chunk: int) -> list[int]:
    """``total`` split into pieces of at most ``chunk`` (the contexts of one forward pass each)."""
    return [min(chunk, total - start) for start in range(0, total, chunk)]


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
    check_tree(tree)
    check_int("n_pairs", n_pairs, 1)
    target = sample_task(tree, n_pairs, n_ctx, noise_std, generator)
    signs = donor_signs(tree, target.signs, split_level, generator)
    donor = sample_task(tree, n_pairs, n_ctx, noise_std, generator, signs=signs, x=target.x)
    query_noise = donor.y_query - (donor.theta * donor.x_query).sum(-1)
    y_query = (donor.theta * target.x_query).sum(-1) + query_noise
    return target, replace(donor, x_query=target.x_query, y_query=y_query)


# ----------------------------------------------------------------------------------------
# The sweep: every split level m and layer l on the same pairs
# ----------------------------------------------------------------------------------------
def _sq_error(theta_hat: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Per-context ``|theta_hat - theta|^2`` in float64 on the CPU, shape ``(B,)``."""
    return squared_error(theta_hat.double(), theta.double()).cpu()


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
        errors: ``(K, L, n)``, the target's squared error of every pair in every cell (``loss``
            is its mean over the last axis; pair ``i`` of row ``m`` is the same pair in every
            column, and in every sweep with the same ``seed``), or ``None``; not in
            ``to_dict()``. A bootstrap over the pairs reads it
            (:func:`fvlib.interventions.patching.reference_distances`).
    """

    baseline: float
    baseline_stderr: float
    baseline_by_level: torch.Tensor
    loss: torch.Tensor
    stderr: torch.Tensor
    donor_loss: torch.Tensor
    n_contexts: int
    errors: torch.Tensor | None = field(default=None, repr=False)

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


def run_patching_sweep(tree, n_layers, n_ctx, noise_std, contexts, seed, chunk, run_pair) -> PatchingResult:
    """Draw ``contexts`` donor/target pairs per split level ``m = 1..K`` (seeded, chunked) and
    score ``run_pair(target, donor) -> (clean theta_hat, [patched theta_hat per layer], target,
    donor)`` (:func:`fvlib.theory.patching_policies.greedy_patcher` for the theory,
    :func:`fvlib.interventions.patching.pair_patcher` for the models); shared by the model and
    theory sweeps so both see the same pairs."""
    check_tree(tree)
    check_int("contexts", contexts, 1)
    K, L = tree.depth, n_layers
    generator = make_generator(seed)
    baseline = [[] for _ in range(K)]
    target_err = [[[] for _ in range(L)] for _ in range(K)]
    donor_err = [[[] for _ in range(L)] for _ in range(K)]
    for row in range(K):
        for size in chunk_sizes(contexts, chunk):
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
        errors=errors,
    )


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
    check_tree(tree)
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


def ideal_patching_mask(depth: int, n_layers: int) -> torch.Tensor:
    """The ideal key-patching pattern as a boolean ``(K, L)`` mask: ``mask[m - 1, l - 1]`` is
    ``True`` (the patch changes what the target measures) exactly when ``l > m``.

    A donor path that splits off at level ``m`` shares the nodes of levels ``0..m-1`` with the
    target. In the ideal adaptive model layer ``l`` measures the path node of level ``l - 1``, so
    donor keys at layers ``l <= m`` route the target to its own node (no effect) and at
    ``l > m`` to a node off its path. That wastes one layer, not every level below it: a later
    outcome reveals the skipped sign, so without noise (and ``L = K``) the expected cost is only
    ``alpha^(K-1) / 2^(K-l)`` (:func:`fvlib.theory.patching.noisefree_patching_loss`).
    """
    check_int("depth", depth, 1)
    check_int("n_layers", n_layers, 1)
    m = torch.arange(1, depth + 1)[:, None]
    l = torch.arange(1, n_layers + 1)[None, :]
    return l > m
