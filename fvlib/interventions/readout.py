"""How an intervention reads a model: one read-out of ``theta_hat`` per model family, the stream
that transplants replace and probes read, and the level-by-level overlap of a prediction with a
path.

An intervention patches a forward pass and reads what the model then predicts, ``theta_hat``
``(B, D)``, to score it against ``theta`` (the sweeps' excess loss) or against the donor's and
the target's paths (:func:`level_overlap`). The two families are read differently:

* :class:`PredictTheta` -- the constrained models (:class:`~fvlib.models.FVTransformer`) output
  ``theta_hat`` (``hook_theta_hat``): :meth:`~fvlib.models.FVTransformer.predict_theta`.
* :class:`EffectiveTheta` -- a standard transformer (:class:`~fvlib.transformer.StandardTransformer`)
  has no ``theta_hat``: its prediction need not be linear in ``x_q``. It is read through its
  **linear part**: for each context, the least-squares fit
  ``theta_eff = argmin_t sum_q (f(x_q) - <t, x_q>)^2`` over ``queries`` probe queries
  ``x_q ~ N(0, I_D)`` (:func:`effective_theta`). For a prediction linear in ``x_q`` this is the
  ``theta_hat`` itself; in general ``E(f(x_q) - <theta, x_q>)^2 = |theta_eff - theta|^2`` plus a
  part that does not depend on ``theta``, so chapter 10's losses hold with ``theta_eff`` for
  ``theta_hat``. The probe queries of a call with ``seed`` come from a generator of their own,
  seeded with ``seed + PROBE_QUERY_SEED_OFFSET``, so the donor/target pairs are those of the
  constrained models with the same ``seed``.
"""

from __future__ import annotations

import torch

from .._checks import check_instance, check_int
from ..hooks import HookedModel, hook_name
from ..models import FVTransformer
from ..priors import TreePrior
from ..task import StatisticBatch, TaskBatch, make_generator
from ..transformer import StandardTransformer

__all__ = [
    "PROBE_QUERY_SEED_OFFSET",
    "model_device",
    "stream_hook_name",
    "workspace_hook_name",
    "level_overlap",
    "effective_theta",
    "Readout",
    "PredictTheta",
    "EffectiveTheta",
]

#: The probe queries of a call with ``seed`` are drawn with ``seed + PROBE_QUERY_SEED_OFFSET``.
PROBE_QUERY_SEED_OFFSET = 77_777


def model_device(model: HookedModel) -> torch.device:
    """The device of the model's parameters."""
    return next(model.parameters()).device


def stream_hook_name(model: HookedModel, layer: int) -> str:
    """The hook name of the stream that the transplant replaces and the probes read at ``layer``
    (1-based): the workspace ``blocks.{l}.hook_workspace`` (constrained models ``(B, l d)``;
    bottlenecked arrangement ``(B, D_m)``) or, in the open arrangement, the query streams
    ``blocks.{l}.hook_query`` ``(B, Q, D_m)``."""
    check_instance("model", model, (FVTransformer, StandardTransformer))
    check_int("layer", layer, 1, model.config.n_layers)
    open_arrangement = isinstance(model, StandardTransformer) and model.config.arrangement == "open"
    return hook_name("query" if open_arrangement else "workspace", layer)


def workspace_hook_name(model: HookedModel, layer: int) -> str:
    """``blocks.{l}.hook_workspace``, the workspace after ``layer`` (1-based), of any model that
    has one (the constrained models, the bottlenecked arrangement)."""
    check_int("layer", layer, 1, model.config.n_layers)
    return hook_name("workspace", layer)


def level_overlap(tree: TreePrior, theta_hat: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """Per level ``k``, the fraction of the path coefficient that ``theta_hat`` recovers:
    ``theta_hat[n_k] s_k / alpha^(k/2)`` at the path node ``n_k`` of ``signs``.

    ``theta_hat (B, D)``, ``signs (B, K)`` -> ``(B, K)``; 1 means that level of this path is
    predicted exactly, 0 that the model puts nothing there.
    """
    nodes = tree.path_nodes(signs.cpu())
    values = theta_hat.double().cpu().gather(-1, nodes)
    return values * signs.cpu().double() / tree.level_scales


@torch.no_grad()
def effective_theta(
    model: StandardTransformer, batch: TaskBatch, x_probe: torch.Tensor, fwd_hooks=()
) -> torch.Tensor:
    """The linear part of the prediction per context, ``(B, D)`` in float64 on the CPU.

    Runs ``model`` (with ``fwd_hooks``, as in :meth:`~fvlib.hooks.HookedModel.run_with_hooks`)
    on the context of ``batch`` with the probe queries ``x_probe (B, Q, D)`` (``Q >= D``) and
    solves ``min_t sum_q (f(x_q) - <t, x_q>)^2`` for each context.
    """
    check_instance("model", model, StandardTransformer)
    B, _, D = batch.x.shape
    if x_probe.ndim != 3 or x_probe.shape[0] != B or x_probe.shape[-1] != D or x_probe.shape[1] < D:
        raise ValueError(f"x_probe must have shape ({B}, Q, {D}) with Q >= {D}, got {tuple(x_probe.shape)}")
    device = model_device(model)
    f = model.run_with_hooks(batch.x.to(device), batch.y.to(device), x_probe.to(device), fwd_hooks=fwd_hooks)
    X, f = x_probe.double().cpu(), f.double().cpu()
    return torch.linalg.solve(X.transpose(1, 2) @ X, (X.transpose(1, 2) @ f[..., None]))[..., 0]


class Readout:
    """A model's ``theta_hat`` under hooks (module docs); subclasses are the families.

    ``readout(batch, fwd_hooks=())`` is ``theta_hat (B, D)`` of ``batch``'s contexts with the
    hooks ``fwd_hooks`` on. Per chunk of donor/target pairs, :meth:`draw` fixes what the chunk
    shares (the probe queries of :class:`EffectiveTheta`); :meth:`batch` places a batch where
    the read-out scores it; :meth:`inputs` gives the forward arguments of a donor run whose
    activations are patched into the target (with the target's query inputs). ``family`` is the
    model class read; ``patch_kinds`` the kinds of
    :func:`fvlib.interventions.patching.patching_sweep` the family has.
    """

    #: The model class read.
    family: type = FVTransformer
    #: The kinds of :func:`fvlib.interventions.patching.patching_sweep` the family has.
    patch_kinds: tuple[str, ...] = ()

    def __init__(self, model: HookedModel, *, queries: int | None = None, seed: int = 0):
        self.model = check_instance("model", model, self.family)
        self.device = model_device(model)

    def draw(self, target: TaskBatch) -> None:
        """Fix what the pairs of one chunk share before they are read (nothing here)."""

    def batch(self, batch: TaskBatch) -> TaskBatch:
        """``batch`` where the read-out scores it (here: on the model's device)."""
        return batch.to(self.device)

    def inputs(self, batch: TaskBatch) -> tuple:
        """The forward arguments of a donor run (here: the batch, on the model's device)."""
        return (batch.to(self.device),)

    def __call__(self, batch: TaskBatch, fwd_hooks=()) -> torch.Tensor:
        raise NotImplementedError


class PredictTheta(Readout):
    """The constrained models' read-out: ``theta_hat (B, D)`` of
    :meth:`~fvlib.models.FVTransformer.predict_theta`, on the model's device. They take no
    probe queries (``queries`` must be ``None``). With ``statistic`` (a model that
    :attr:`~fvlib.models.FVTransformer.reads_statistic`) the batches are read as their pooled
    statistics (:meth:`~fvlib.task.TaskBatch.pooled`): no per-token keys, so ``hook_keys`` does
    not fire; key patching then patches ``phi`` (:func:`fvlib.interventions.patching.pair_patcher`)."""

    #: The constrained models.
    family = FVTransformer
    #: Key patching.
    patch_kinds = ("keys",)

    def __init__(self, model: FVTransformer, *, queries: int | None = None, seed: int = 0, statistic: bool = False):
        if queries is not None:
            raise ValueError(
                f"queries are the standard transformers' probe queries; a constrained model outputs theta_hat "
                f"itself, got queries={queries!r}"
            )
        super().__init__(model)
        if statistic and not model.reads_statistic:
            raise ValueError(f"statistic=True needs a model that reads only the pooled statistic; router "
                             f"{model.config.router!r} reads every token")
        self.statistic = bool(statistic)

    def batch(self, batch: TaskBatch) -> TaskBatch | StatisticBatch:
        """``batch`` on the model's device, as its pooled statistics with ``statistic``."""
        batch = batch.to(self.device)
        return batch.pooled() if self.statistic and isinstance(batch, TaskBatch) else batch

    def __call__(self, batch: TaskBatch | StatisticBatch, fwd_hooks=()) -> torch.Tensor:
        with self.model.hooks(fwd_hooks):
            return self.model.predict_theta(batch.to(self.device))


class EffectiveTheta(Readout):
    """The standard transformers' read-out: :func:`effective_theta` ``(B, D)`` (float64, CPU)
    from ``queries`` probe queries per context (default 32, at least ``D``), drawn per chunk
    with ``seed + PROBE_QUERY_SEED_OFFSET`` and shared by donor and target."""

    #: The standard transformers.
    family = StandardTransformer
    #: State patching, what the context tokens send or what the workspace asks.
    patch_kinds = ("sent", "query")

    def __init__(self, model: StandardTransformer, *, queries: int | None = None, seed: int = 0):
        super().__init__(model)
        self.queries = check_int("queries", 32 if queries is None else queries, model.config.dim)
        self.query_gen = make_generator(check_int("seed", seed, 0) + PROBE_QUERY_SEED_OFFSET)
        self.x_probe = None

    def draw(self, target: TaskBatch) -> None:
        """Draw the chunk's ``(B, Q, D)`` standard normal probe queries, on the CPU."""
        B, _, D = target.x.shape
        self.x_probe = torch.randn(B, self.queries, D, generator=self.query_gen, dtype=target.x.dtype)

    def batch(self, batch: TaskBatch) -> TaskBatch:
        """``batch`` as it is (:func:`effective_theta` moves what it runs, and scores on the CPU)."""
        return batch

    def inputs(self, batch: TaskBatch) -> tuple:
        """``(x, y, x_probe)`` on the model's device: the batch's context with the chunk's probe queries."""
        return batch.x.to(self.device), batch.y.to(self.device), self.x_probe.to(self.device)

    def __call__(self, batch: TaskBatch, fwd_hooks=()) -> torch.Tensor:
        return effective_theta(self.model, batch, self.x_probe, fwd_hooks)
