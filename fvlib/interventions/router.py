"""What the router of a trained model A measures (gated, or any router whose keys are linear in
the token) (chapter 8, *Experiments*, "How close does model A come to the best adaptive reference?", and
the appendix *How the experiments were run*; chapter 9, *Inside the model*), beside the theory on the same contexts.

* :func:`measurement_profile` -- where each layer of a model A's router puts its
  measurement weight, relative to the context's own path;
* :func:`router_directions` -- the measurement rows the router used in each context;
* :func:`router_bayes_decode` -- model A's own decoder against the exact posterior given the
  directions its router used in each context (router + Bayes decoder), on the same contexts;
* :func:`router_policy_alignment` -- how far the router measures what a theory policy measures.
"""

from __future__ import annotations

import torch

from ..hooks import hook_name
from ..priors import TreePrior
from ..routers import TokenLinearRouter
from ..stats import mean_and_stderr, squared_error
from ..theory import FiniteSampleChannel, channel_tau2, policy_rollout

__all__ = ["measurement_profile", "router_bayes_decode", "router_directions", "router_policy_alignment"]


def _check_matrix_router(model, what: str) -> None:
    """``model``'s routers give a measurement matrix ``G_l(Phi)`` (a router whose keys are linear
    in the token: gated, linear, bilinear, coord; :class:`~fvlib.routers.TokenLinearRouter`)."""
    if not isinstance(model.block(1).router, TokenLinearRouter):
        raise ValueError(f"{what} needs a router whose keys are linear in the token "
                         f"(gated, linear, bilinear or coord), got {model.config.router!r}")


def measurement_profile(model, tree, batch):
    """Where model A's router looks: for every layer ``l`` and tree level ``k``, the mean
    fraction of the squared weight of the measurement matrix ``G_l(Phi_{l-1})`` (all ``d``
    channels together) that falls on the context's *own* path node at level ``k``.

    ``batch``: a :class:`fvlib.task.TaskBatch` from ``tree`` (its ``signs`` give the paths).
    Returns a ``(L, K + 1)`` numpy array; the last column is the weight off the path. Rows sum
    to one. In the ideal adaptive policy row ``l`` is the indicator of level ``l - 1``.
    """
    _check_matrix_router(model, "measurement_profile")
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", "*"))
        nodes = tree.path_nodes(batch.signs.cpu())  # (B, K)
        rows = []
        for l in range(1, model.config.n_layers + 1):
            previous = cache[hook_name("workspace", l - 1)] if l > 1 else batch.x_query.new_zeros(batch.batch_size, 0)
            matrix = model.block(l).router.matrix(previous.to(batch.x_query.dtype))  # (B, d, D)
            weight = (matrix**2).sum(1).double().cpu()  # (B, D)
            weight = weight / weight.sum(-1, keepdim=True)
            on_path = weight.gather(-1, nodes)  # (B, K)
            rows.append(torch.cat([on_path, 1 - on_path.sum(-1, keepdim=True)], dim=-1).mean(0))
    return torch.stack(rows).numpy()


def router_directions(model, batch) -> torch.Tensor:
    """The measurement rows a model A's router used in each context, ``(B, L d, D)`` float64.

    Row ``(l - 1) d + c`` is channel ``c`` of ``G_l(Phi_{l-1})``: the model's
    ``phi_l = (1/N) sum_i y_i G_l x_i = G_l g_hat`` with ``g_hat`` the context's statistic.
    """
    _check_matrix_router(model, "router_directions")
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
