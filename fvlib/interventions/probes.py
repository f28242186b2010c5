"""Probes (chapter 9, *Inside the model*; chapter 11, *Standard transformers*): linear or small
MLP probes reading the path signs ``s_k`` from the stream after each layer, written once for
both model families (:func:`run_probes`).

* :func:`probe_workspace` -- the workspace ``Phi_l`` (``blocks.{l}.hook_workspace``: the
  constrained models, the bottlenecked arrangement);
* :func:`probe_stream` -- the stream of :func:`~fvlib.interventions.readout.stream_hook_name`:
  the workspace, or in the open arrangement the stream of the context's own query token (it
  depends on ``x_q`` as well as on the context).

A linear probe (:func:`fit_linear_probe`, closed-form least squares with a bias on the +-1
labels) only sees signs stored with a fixed orientation; a model may store finer levels with a
path-dependent orientation (measuring ``-e_n`` on one branch, ``+e_n`` on the other), which an
MLP probe (:func:`fit_mlp_probe`) still reads. :func:`workspace_projections` looks at the same
workspaces without labels: their principal components, layer by layer (chapter 9).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from .._checks import check_int
from ..hooks import HookedModel, hook_name
from ..priors import TreePrior
from ..task import make_generator, sample_task
from ..theory import DEFAULT_CHUNK, check_tree, chunk_sizes
from .readout import model_device, stream_hook_name, workspace_hook_name

__all__ = [
    "PROBE_KINDS",
    "ProbeResult",
    "fit_linear_probe",
    "fit_mlp_probe",
    "probe_accuracy",
    "run_probes",
    "probe_workspace",
    "probe_stream",
    "workspace_projections",
]


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
def run_probes(
    model: HookedModel,
    tree: TreePrior,
    n_ctx: int,
    noise_std: float,
    *,
    stream: Callable[[HookedModel, int], str],
    kind: str = "linear",
    contexts: int = 4000,
    seed: int = 0,
    test_fraction: float = 0.5,
    chunk: int = DEFAULT_CHUNK,
) -> ProbeResult:
    """Fit probes ``stream after layer l -> s_k`` on a train split and score them on a test
    split, for every layer ``l`` and tree level ``k``.

    ``stream(model, l)`` is the hook name read at layer ``l`` (a ``(B, f)`` activation, or
    ``(B, Q, f)`` of which the first query token's is read). ``kind='linear'``: closed-form
    least squares (with a bias) on the +-1 labels; ``kind='mlp'``: one small MLP per layer
    with ``K`` outputs, see :func:`fit_mlp_probe`. ``contexts`` fresh contexts drawn with
    ``seed``, the first ``1 - test_fraction`` of them to fit.
    """
    check_tree(tree)
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
    device = model_device(model)
    generator = make_generator(seed)
    names = [stream(model, l) for l in range(1, L + 1)]
    streams, signs = [[] for _ in range(L)], []
    for size in chunk_sizes(contexts, chunk):
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


probe_workspace = partial(run_probes, stream=workspace_hook_name)
probe_workspace.__doc__ = """Probes ``Phi_l -> s_k`` of the workspace after every layer ``l``
(``blocks.{l}.hook_workspace``): :func:`run_probes` with
:func:`~fvlib.interventions.readout.workspace_hook_name`."""
probe_stream = partial(run_probes, stream=stream_hook_name)
probe_stream.__doc__ = """Probes of the stream that the transplant replaces (the workspace, or
the open arrangement's query stream): :func:`run_probes` with
:func:`~fvlib.interventions.readout.stream_hook_name`."""


def workspace_projections(model, batch, components: int = 2) -> list[dict]:
    """Principal-component projections of the workspace ``Phi_l`` of every layer.

    ``batch``: a :class:`fvlib.task.TaskBatch` with ``B`` contexts. For each layer ``l`` the
    centred workspaces ``(B, l d)`` are projected on their top ``min(components, l d)``
    principal directions (``torch.linalg.svd``). Returns a list of ``L`` dicts with
    ``coords`` (``(B, c)`` numpy array) and ``explained`` (``(c,)`` fractions of variance).
    """
    with torch.no_grad():
        _, cache = model.run_with_cache(batch, names_filter=hook_name("workspace", "*"))
    out = []
    for l in range(1, model.config.n_layers + 1):
        phi = cache[hook_name("workspace", l)].double().cpu()
        centred = phi - phi.mean(0)
        _, s, vh = torch.linalg.svd(centred, full_matrices=False)
        c = min(components, vh.shape[0])
        out.append({"coords": (centred @ vh[:c].T).numpy(), "explained": (s[:c] ** 2 / (s**2).sum()).numpy()})
    return out
