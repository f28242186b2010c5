"""The function-vector transplant (chapter 10, *Causal interventions*; chapter 11, *Standard
transformers*), written once for both model families: replace the target's stream after layer
``l`` (:func:`~fvlib.interventions.readout.stream_hook_name`: the workspace ``Phi_l`` of the
constrained models and of the bottlenecked arrangement, the query streams of the open one;
donor and target share the query inputs) by the donor's, and score the prediction level by
level against both paths (:func:`~fvlib.interventions.readout.level_overlap`).

* :func:`transplant_workspace` -- the constrained models, read by ``theta_hat``;
* :func:`transplant_stream` -- the standard transformers, read by ``theta_eff`` from probe
  queries shared by donor and target (:func:`~fvlib.interventions.readout.effective_theta`).

Both are :func:`run_transplant` with a read-out (:mod:`fvlib.interventions.readout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from .._checks import check_int
from ..hooks import HookedModel, replace_with
from ..priors import TreePrior
from ..task import make_generator
from ..theory import DEFAULT_CHUNK, check_tree, chunk_sizes, patching_pairs
from .readout import EffectiveTheta, PredictTheta, Readout, level_overlap, stream_hook_name

__all__ = ["TransplantResult", "run_transplant", "transplant_workspace", "transplant_stream"]


@dataclass
class TransplantResult:
    """Whose ``theta`` the model predicts after the target's stream after layer ``l`` (the
    workspace ``Phi_l``, or the open arrangement's query streams) is replaced by the donor's.

    Attributes:
        target_overlap: ``(L, K)``; row ``l - 1`` (the stream after layer ``l`` transplanted),
            column ``k``: mean :func:`~fvlib.interventions.readout.level_overlap` of
            ``theta_hat`` with the target's path at level ``k`` (1 = the model predicts the
            target there).
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
def run_transplant(
    model: HookedModel,
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    *,
    readout: type[Readout],
    split_level: int = 1,
    contexts: int = 2000,
    queries: int | None = None,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
) -> TransplantResult:
    """Replace the target's stream after layer ``l`` by the donor's, for every layer ``l``, and
    score the prediction (read by ``readout``) against both paths level by level.

    Rows of the result are layers ``l = 1..L``, columns tree levels; ``contexts`` pairs split at
    ``split_level``, drawn with ``seed``; ``queries`` probe queries per context for
    :class:`~fvlib.interventions.readout.EffectiveTheta`. With the default ``split_level=1``
    the two paths share only the root node (with opposite signs), so each level's overlap says
    cleanly whose coefficient the model outputs.
    """
    read = readout(model, queries=queries, seed=seed)
    check_tree(tree)
    check_int("contexts", contexts, 1)
    L = model.config.n_layers
    generator = make_generator(seed)
    names = [stream_hook_name(model, l) for l in range(1, L + 1)]
    target_ov, donor_ov, base_ov = [[] for _ in range(L)], [[] for _ in range(L)], []
    for size in chunk_sizes(contexts, chunk):
        target, donor = (read.batch(b) for b in patching_pairs(tree, size, split_level, n_ctx, noise_std, generator))
        read.draw(target)
        _, donor_cache = model.run_with_cache(*read.inputs(donor), names_filter=names)
        base_ov.append(level_overlap(tree, read(target), target.signs))
        for l, name in enumerate(names, start=1):
            theta_hat = read(target, [(name, replace_with(donor_cache[name]))])
            target_ov[l - 1].append(level_overlap(tree, theta_hat, target.signs))
            donor_ov[l - 1].append(level_overlap(tree, theta_hat, donor.signs))
    return TransplantResult(
        target_overlap=torch.stack([torch.cat(rows).mean(0) for rows in target_ov]),
        donor_overlap=torch.stack([torch.cat(rows).mean(0) for rows in donor_ov]),
        baseline_overlap=torch.cat(base_ov).mean(0),
        split_level=split_level,
        n_contexts=contexts,
    )


transplant_workspace = partial(run_transplant, readout=PredictTheta)
transplant_workspace.__doc__ = """The transplant of a constrained model's workspace ``Phi_l``
(``blocks.{l}.hook_workspace``), read by ``theta_hat``: :func:`run_transplant` with
:class:`~fvlib.interventions.readout.PredictTheta`."""
transplant_stream = partial(run_transplant, readout=EffectiveTheta)
transplant_stream.__doc__ = """The function-vector transplant of a standard transformer (its
workspace, or its query streams in the open arrangement), read by ``theta_eff`` from ``queries``
probe queries (32): :func:`run_transplant` with :class:`~fvlib.interventions.readout.EffectiveTheta`."""
