"""The theory policies patched as the models are (chapter 10, *Causal interventions*): the two
references a trained model's key-patching heatmap is compared with, and their heatmaps.

A patch at layer ``l`` gives the target the donor's measurement there: the donor's node (or
direction) read on the target's own data. What happens next depends on what the patched policy
is taken to know, and there are two references (:data:`PATCHING_REFERENCES`):

* ``"aware"`` -- every later choice and the Bayes decoder know that slot ``l`` measured the
  donor's node: the target's posterior is updated with the node actually measured
  (``forced=`` of :func:`~fvlib.theory.strategies.run_greedy` and
  :func:`~fvlib.theory.adaptive_opt.policy_rollout`). No network can do this.
* ``"unaware"`` -- what a network with fixed weights does: its later routers and its decoder see
  only the workspace, so they read slot ``l`` as the measurement of the node its *own* workspace
  selects there (from its slots ``1..l-1``, unchanged by the patch); every later choice and the
  decoder use that reading (``readings=`` of the same two functions; chapter 1's exercise
  *The state is enough* replays a policy from its workspace in the same way).

Without channel noise both give the pattern of
:func:`~fvlib.theory.patching.noisefree_patching_loss`, ``alpha^(K-1) / 2^(K-l)`` after the split
(a later outcome corrects either policy). With little but some noise the unaware one differs at
the last layer ``l = K``: it reads the donor's off-path node (zero plus noise) as its own last
node and believes the sign the noise points to, wrong half the time, so it costs
``2 alpha^(K-1)``; at ``N = 128`` it costs far more than the aware one at early layers.

Both are Monte Carlo over the donor/target pairs of
:func:`~fvlib.theory.patching.run_patching_sweep`, the models' very pairs for a given seed, on
one of two channels (:data:`~fvlib.theory.strategies.CHANNELS`): ``"finite"``, the pair's own
finite-``N`` statistics ``g_hat = (1/N) sum_i y_i x_i`` (what the models read; chapter 10's
heatmaps), or ``"gaussian"``, the large-``N`` channel ``g = theta + tau z`` with ``tau^2`` of
:func:`~fvlib.theory.closed_forms.channel_tau2` and independent noise for donor and target.

* :func:`greedy_patcher`, :func:`policy_patcher` -- the ``run_pair`` of the greedy policy and
  of any direction policy (e.g. an :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`);
* :func:`theory_patching_sweep` -- the heatmap (a :class:`~fvlib.theory.patching.PatchingResult`);
  :func:`theory_patching_references` -- the heatmaps of both references in one pass over the pairs;
* :func:`theory_patching_row` -- one row of the greedy heatmap against the context length
  (:class:`PatchingRow`), from :func:`~fvlib.theory.patching.sample_pair_statistics`.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace

import torch

from .._checks import check_int
from ..priors import TreePrior
from ..stats import mean_and_stderr, squared_error
from ..task import make_generator
from .adaptive_opt import OptimisedPolicy, policy_rollout
from .channel import FiniteSampleChannel
from .closed_forms import channel_tau2
from .patching import (
    DEFAULT_CHUNK,
    PatchingResult,
    check_tree,
    donor_signs,
    noisefree_patching_loss,
    run_patching_sweep,
    sample_pair_statistics,
)
from .strategies import CHANNELS, run_greedy

__all__ = [
    "PATCHING_REFERENCES",
    "check_reference",
    "pair_channels",
    "patched_greedy_runs",
    "greedy_patcher",
    "policy_patcher",
    "theory_patching_sweep",
    "theory_patching_references",
    "PatchingRow",
    "theory_patching_row",
]

#: The two references, by what a patched theory policy knows of the patch. With ``"aware"`` its
#: posterior is told which node slot ``l`` measured; with ``"unaware"`` it reads slot ``l`` as
#: its own node's measurement, as a network does.
PATCHING_REFERENCES = ("aware", "unaware")


def check_reference(reference) -> str:
    """``reference`` if it is one of :data:`PATCHING_REFERENCES`, else ``ValueError`` naming it."""
    if reference not in PATCHING_REFERENCES:
        raise ValueError(f"reference must be one of {PATCHING_REFERENCES}, got {reference!r}")
    return reference


def _references(reference) -> tuple[str, ...]:
    """One reference or a sequence of distinct ones, as a tuple (each checked)."""
    refs = (reference,) if isinstance(reference, str) else tuple(reference)
    if not refs or len(set(refs)) != len(refs):
        raise ValueError(f"reference must be one of {PATCHING_REFERENCES} or a sequence of distinct ones, "
                         f"got {reference!r}")
    return tuple(check_reference(ref) for ref in refs)


def _check_channel(channel) -> str:
    if channel not in CHANNELS:
        raise ValueError(f"channel must be one of {CHANNELS}, got {channel!r}")
    return channel


def pair_channels(target, donor, channel: str, tau2: float, generator: torch.Generator | None):
    """The target's and the donor's observations as two
    :class:`~fvlib.theory.channel.FiniteSampleChannel` of ``B`` contexts each.

    ``channel="finite"``: the pair's statistics ``g_hat (B, D)`` (they share their inputs);
    ``"gaussian"``: ``theta + sqrt(tau2) z`` with independent ``z ~ N(0, I_D)`` for the two,
    drawn from ``generator``.
    """
    target, donor = target.to("cpu", torch.float64), donor.to("cpu", torch.float64)
    if _check_channel(channel) == "finite":
        return FiniteSampleChannel(target.sufficient_statistic()), FiniteSampleChannel(donor.sufficient_statistic())
    tau = math.sqrt(tau2)
    noisy = [batch.theta + tau * torch.randn(batch.theta.shape, generator=generator, dtype=torch.float64)
             for batch in (target, donor)]
    return FiniteSampleChannel(noisy[0]), FiniteSampleChannel(noisy[1])


def patched_greedy_runs(tree: TreePrior, target_chan, donor_nodes: torch.Tensor, n_layers: int, tau2: float,
                        layers, reference: str = "aware") -> list[torch.Tensor]:
    """``theta_hat (B, D)`` of the greedy policy on ``target_chan`` patched at each layer ``l`` of
    ``layers`` with the donor's node ``donor_nodes[:, l - 1]`` (``donor_nodes (B, L)``), read on
    the target's data; ``reference`` says what the policy knows of it (module docs)."""
    if check_reference(reference) == "aware":
        return [run_greedy(tree, target_chan, n_layers, tau2, forced={l: donor_nodes[:, l - 1]}).theta_hat
                for l in layers]
    return [run_greedy(tree, target_chan, n_layers, tau2,
                       readings={l: target_chan.measure_nodes(donor_nodes[:, l - 1])}).theta_hat
            for l in layers]


def greedy_patcher(tree: TreePrior, n_layers: int, tau2: float, layers, *, reference="aware",
                   channel: str = "finite", generator: torch.Generator | None = None):
    """``run_pair(target, donor) -> (clean theta_hat, [patched theta_hat for l in layers], target,
    donor)`` for :func:`~fvlib.theory.patching.run_patching_sweep`, for the greedy theory policy
    of depth ``n_layers`` (likelihood variance ``tau2``): "keys" at layer ``l`` are the node
    measured there, so the target reads the donor's layer-``l`` node on its own data, knowing it
    (``reference="aware"``) or taking it for its own node's reading (``"unaware"``). Several
    references (a sequence) share the donor's and the unpatched runs; the patched runs then come
    reference by reference, each over ``layers``. ``channel``, ``generator``: as in
    :func:`pair_channels`."""
    references = _references(reference)
    _check_channel(channel)

    def run_pair(target, donor):
        target_chan, donor_chan = pair_channels(target, donor, channel, tau2, generator)
        donor_nodes = run_greedy(tree, donor_chan, n_layers, tau2).nodes
        clean = run_greedy(tree, target_chan, n_layers, tau2).theta_hat
        patched = [theta_hat for ref in references
                   for theta_hat in patched_greedy_runs(tree, target_chan, donor_nodes, n_layers, tau2, layers, ref)]
        return clean, patched, target, donor

    return run_pair


def policy_patcher(tree: TreePrior, n_layers: int, tau2: float, layers, policy, *, reference="aware",
                   channel: str = "finite", generator: torch.Generator | None = None):
    """The same for any direction policy (an :class:`~fvlib.theory.adaptive_opt.OptimisedPolicy`,
    or anything :func:`~fvlib.theory.adaptive_opt.policy_rollout` runs): "keys" at layer ``l``
    are the direction measured there; the target reads the donor's layer-``l`` direction on its
    own data, knowing it (``"aware"``) or taking it for its own direction's reading
    (``"unaware"``), and is decoded exactly."""
    references = _references(reference)
    _check_channel(channel)
    rule = policy.policy if isinstance(policy, OptimisedPolicy) else policy

    def run_pair(target, donor):
        target_chan, donor_chan = pair_channels(target, donor, channel, tau2, generator)
        with torch.no_grad():
            donor_rows = policy_rollout(tree, rule, donor_chan, n_layers, tau2).directions
            clean = policy_rollout(tree, rule, target_chan, n_layers, tau2).theta_hat
            patched = [_patched_policy_run(tree, rule, target_chan, donor_rows[:, l - 1], l, n_layers, tau2, ref)
                       for ref in references for l in layers]
        return clean, patched, target, donor

    return run_pair


def _patched_policy_run(tree, rule, target_chan, donor_row, layer, n_layers, tau2, reference) -> torch.Tensor:
    """``theta_hat (B, D)`` of the direction policy ``rule`` patched at ``layer`` with the donor's
    row ``donor_row (B, D)``, aware or unaware of it."""
    if reference == "aware":
        return policy_rollout(tree, rule, target_chan, n_layers, tau2, forced={layer: donor_row}).theta_hat
    reading = target_chan.measure(donor_row[:, None, :])[:, 0]
    return policy_rollout(tree, rule, target_chan, n_layers, tau2, readings={layer: reading}).theta_hat


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
    reference: str = "aware",
    channel: str = "finite",
) -> PatchingResult:
    """The key-patching heatmap of a theory policy (greedy by default), on the same pairs as the
    model's: a :class:`~fvlib.theory.patching.PatchingResult` with Monte Carlo standard errors.

    Each layer of the policy measures one node (greedy) or one direction (``policy``) and decodes
    with the exact posterior. The donor's "keys" at layer ``l`` are what it measures there;
    patching makes the target read that node or direction on its own data at layer ``l``.
    ``reference="aware"`` (the default, chapter 10's): the target's later choices and decoder
    know what slot ``l`` measured. ``reference="unaware"``: they read slot ``l`` as the
    measurement of the node the target's own workspace selects there, as a network does.
    Pairs are drawn exactly as in :func:`fvlib.interventions.patching.key_patching_sweep` with
    the same ``seed``, so the heatmaps compare the same contexts (and the two references the
    same pairs). ``n_layers`` is the policy's depth (the model's ``L``).

    ``policy``: another direction policy instead of greedy, e.g. the optimised adaptive policy
    (see :func:`policy_patcher`). ``channel``: ``"finite"`` (the pairs' own statistics, the
    default) or ``"gaussian"`` (``theta + tau z``, its noise seeded by ``seed + 1``).
    """
    return theory_patching_references(tree, n_ctx, noise_std, n_layers, contexts=contexts, seed=seed, chunk=chunk,
                                      policy=policy, references=(check_reference(reference),),
                                      channel=channel)[reference]


def theory_patching_references(
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    n_layers: int,
    *,
    contexts: int = 2000,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
    policy=None,
    references=PATCHING_REFERENCES,
    channel: str = "finite",
) -> dict[str, PatchingResult]:
    """``{reference: heatmap}``: :func:`theory_patching_sweep` for each of ``references`` (both by
    default), in one pass over the pairs: the donor's and the unpatched runs are shared, so the
    unpatched loss is the same object of every result and the second reference costs only its
    patched runs. Each heatmap equals the one :func:`theory_patching_sweep` gives alone."""
    check_int("n_layers", n_layers, 1)
    references = _references(references)
    tau2 = channel_tau2(tree, n_ctx, noise_std)
    layers = range(1, n_layers + 1)
    kw = {"reference": references, "channel": _check_channel(channel),
          "generator": make_generator(seed + 1) if channel == "gaussian" else None}
    if policy is None:
        patcher = greedy_patcher(tree, n_layers, tau2, layers, **kw)
    else:
        patcher = policy_patcher(tree, n_layers, tau2, layers, policy, **kw)
    joint = run_patching_sweep(tree, len(references) * n_layers, n_ctx, noise_std, contexts, seed, chunk, patcher)
    return {ref: _columns(joint, i * n_layers, (i + 1) * n_layers) for i, ref in enumerate(references)}


def _columns(result: PatchingResult, start: int, stop: int) -> PatchingResult:
    """``result`` with its layer columns ``start..stop-1`` only (the baseline kept)."""
    errors = None if result.errors is None else result.errors[:, start:stop].clone()
    return replace(result, loss=result.loss[:, start:stop].clone(), stderr=result.stderr[:, start:stop].clone(),
                   donor_loss=result.donor_loss[:, start:stop].clone(), errors=errors)


# ----------------------------------------------------------------------------------------
# One heatmap row against the context length
# ----------------------------------------------------------------------------------------
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
        noisefree: ``(L,)``, :func:`~fvlib.theory.patching.noisefree_patching_loss` (``None``
            when ``L != K``).
        split_level, noise_std, n_contexts: the row ``m``, the label noise ``sigma`` and the
            donor/target pairs per context length (the same leaves at every ``N``).
        reference: ``"aware"`` or ``"unaware"`` (:data:`PATCHING_REFERENCES`).
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
    reference: str = "aware"

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
            "reference": self.reference,
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
    reference: str = "aware",
) -> PatchingRow:
    """Row ``m = split_level`` of :func:`theory_patching_sweep` at every ``N`` in ``n_ctx_values``.

    ``contexts`` donor/target leaf pairs (split at ``split_level``, drawn once with ``seed``
    and reused at every ``N``); for each ``N`` their finite-``N`` statistics come from
    :func:`~fvlib.theory.patching.sample_pair_statistics` (shared inputs, so long contexts cost
    ``O(N)`` per pair), the donor's greedy rollout gives its nodes, and the target is rerun
    patched at each layer ``l``, aware or unaware of it (``reference``) exactly as in
    :func:`theory_patching_sweep` (whose pairs it does not reproduce: the random streams differ).
    """
    check_tree(tree)
    check_int("contexts", contexts, 1)
    check_int("n_layers", n_layers, 1)
    check_reference(reference)
    values = _check_n_ctx_values(n_ctx_values)
    generator = make_generator(seed)
    target_signs = tree.sample_signs(contexts, generator)
    donor = donor_signs(tree, target_signs, split_level, generator)
    theta_t, theta_d = tree.theta_from_signs(target_signs), tree.theta_from_signs(donor)
    layers = range(1, n_layers + 1)
    losses, errors, steps, bases, base_errors = [], [], [], [], []
    for i, n in enumerate(values):
        g_t, g_d = sample_pair_statistics(theta_t, theta_d, n, noise_std, make_generator(seed + 1 + i))
        tau2 = channel_tau2(tree, n, noise_std)
        target_chan, donor_chan = FiniteSampleChannel(g_t), FiniteSampleChannel(g_d)
        donor_nodes = run_greedy(tree, donor_chan, n_layers, tau2).nodes
        clean = run_greedy(tree, target_chan, n_layers, tau2).theta_hat
        runs = patched_greedy_runs(tree, target_chan, donor_nodes, n_layers, tau2, layers, reference)
        patched = torch.stack([squared_error(theta_hat, theta_t) for theta_hat in runs])  # (L, B)
        mean, err = mean_and_stderr(patched)
        base, base_err = mean_and_stderr(squared_error(clean, theta_t))
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
        reference=reference,
    )
