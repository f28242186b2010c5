"""Hook points, handles and activation caches shared by every fvlib model (TransformerLens style,
plain torch underneath), and the input checks of their forward passes.

A model marks each activation it exposes with a :class:`HookPoint` and derives from
:class:`HookedModel`, which names every hook point after its module path. **Layers are
numbered from 1**, as in the book's math: ``blocks.{l}.hook_{kind}`` belongs to layer ``l``,
``hook_{kind}`` to the whole model. :func:`hook_name` builds every name, for every model
family; which kinds a family has:

* the constrained models A, B, C (:mod:`fvlib.models`): ``keys``, ``phi``, ``workspace`` per
  layer, ``theta_hat`` and ``prediction`` per model;
* the standard transformers (:mod:`fvlib.transformer`), by arrangement (``bottlenecked``,
  ``open``): see :data:`LAYER_HOOKS` and :data:`MODEL_HOOKS`.

A hook is ``fn(tensor, hook) -> tensor | None``; returning ``None`` keeps the tensor and
``hook.name`` is the hook's name (anything else, or a tensor of another shape, is refused naming
the hook point). Use :meth:`HookedModel.run_with_cache`,
:meth:`HookedModel.run_with_hooks` or the context manager :meth:`HookedModel.hooks`;
:meth:`HookPoint.add_hook` returns a :class:`HookHandle` whose ``remove()`` takes the hook out.
:func:`replace_with` is the hook that swaps an activation for a given tensor (a patch).
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

from ._checks import check_int
from .task import StatisticBatch, TaskBatch

__all__ = [
    "FAMILIES",
    "LAYER_HOOKS",
    "MODEL_HOOKS",
    "hook_name",
    "replace_with",
    "HookPoint",
    "HookHandle",
    "ActivationCache",
    "HookedModel",
    "check_model_input",
]

HookFn = Callable[[torch.Tensor, "HookPoint"], "torch.Tensor | None"]

#: The model families, the constrained models A, B, C and the two arrangements of the standard
#: transformers.
FAMILIES = ("constrained", "bottlenecked", "open")
_TRANSFORMERS = ("bottlenecked", "open")

#: The activations hooked in every layer ``l``, named ``blocks.{l}.hook_{kind}``, in forward
#: order, with the families that have them.
LAYER_HOOKS = {
    "queries": _TRANSFORMERS,
    "keys": FAMILIES,
    "values": _TRANSFORMERS,
    "pattern": _TRANSFORMERS,
    "phi": ("constrained", "bottlenecked"),
    "attn_out": _TRANSFORMERS,
    "workspace": ("constrained", "bottlenecked"),
    "read_out": ("bottlenecked",),
    "context": _TRANSFORMERS,
    "query": _TRANSFORMERS,
}
#: The activations hooked once per model, named ``hook_{kind}``, with the families that have them.
MODEL_HOOKS = {
    "theta_hat": ("constrained",),
    "prediction": FAMILIES,
}


def hook_name(kind: str, layer: int | str | None = None) -> str:
    """The name of a hook point, e.g. ``hook_name("keys", 2) == "blocks.2.hook_keys"``.

    ``kind`` is one of :data:`LAYER_HOOKS` with a 1-based ``layer`` (or ``"*"``, the glob
    pattern of every layer, for ``names_filter``), or one of :data:`MODEL_HOOKS` without one:
    ``hook_name("theta_hat") == "hook_theta_hat"``. The kinds are those of every family; some
    exist in one family only (``theta_hat``: the constrained models; ``queries``, ``values``,
    ``pattern``, ``attn_out``, ``context``, ``query``: the standard transformers; ``read_out``:
    the bottlenecked arrangement). A model's :meth:`HookedModel.hook_names` lists the names it
    has, and its hooks raise ``ValueError`` for any other.
    """
    if kind in MODEL_HOOKS:
        if layer is not None:
            raise ValueError(f"hook_{kind} belongs to the whole model, not to a layer; got layer={layer!r}")
        return f"hook_{kind}"
    if kind not in LAYER_HOOKS:
        raise ValueError(f"hook kind must be one of {tuple(LAYER_HOOKS) + tuple(MODEL_HOOKS)}, got {kind!r}")
    if layer != "*":
        check_int("layer", layer, 1)
    return f"blocks.{layer}.hook_{kind}"


def replace_with(tensor: torch.Tensor) -> HookFn:
    """A hook that replaces the activation by ``tensor`` (of the same shape): a patch."""

    def hook(activation, hook_point):
        return tensor

    return hook


def check_model_input(name: str, value) -> torch.Tensor:
    """``value`` if it is a floating-point ``torch.Tensor``: an input handed to a model's forward
    pass. Else ``TypeError`` naming ``name`` (not a tensor, e.g. a NumPy array, or an integer or
    bool dtype). The values are not looked at: the check costs nothing per element and holds
    under ``torch.func.vmap`` (batched training calls the forward pass with tensors); a NaN in
    gives a NaN out, where it shows."""
    if not isinstance(value, torch.Tensor):
        kind = f"{type(value).__module__}.{type(value).__name__}".removeprefix("builtins.")
        raise TypeError(f"{name} must be a torch.Tensor, got {kind}: convert it with torch.as_tensor({name}, "
                        f"dtype=torch.float32)")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}: convert it with "
                        f"{name}.float()")
    return value


class HookHandle:
    """What :meth:`HookPoint.add_hook` returns: :meth:`remove` takes out exactly that hook
    (the same function added twice has two handles)."""

    def __init__(self, hook_fns: dict, key: int):
        self._hook_fns, self._key = hook_fns, key

    def remove(self) -> None:
        """Remove the hook; removing it again does nothing."""
        self._hook_fns.pop(self._key, None)


class HookPoint(nn.Module):
    """Identity module marking a named activation; hooks may read or replace it.

    Each hook is ``fn(tensor, hook) -> tensor | None``; hooks run in the order they were
    added and a returned tensor replaces the activation (``None`` keeps it).
    """

    _keys = itertools.count()

    def __init__(self):
        super().__init__()
        self.name = ""
        self._hook_fns: dict[int, HookFn] = {}

    def add_hook(self, fn: HookFn) -> HookHandle:
        """Run ``fn`` on every forward pass until the returned handle's ``remove()``."""
        key = next(self._keys)
        self._hook_fns[key] = fn
        return HookHandle(self._hook_fns, key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fn in list(self._hook_fns.values()):
            out = fn(x, self)
            if out is not None:
                if not isinstance(out, torch.Tensor):
                    raise TypeError(f"hook on {self.name} returned a {type(out).__name__}; a hook returns None "
                                    f"(keep the activation) or a tensor of shape {tuple(x.shape)}")
                if out.shape != x.shape:
                    raise ValueError(
                        f"hook on {self.name} returned shape {tuple(out.shape)}, expected {tuple(x.shape)}"
                    )
                x = out
        return x

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


class ActivationCache(Mapping):
    """Read-only mapping from hook name to the activation recorded in one forward pass."""

    def __init__(self, activations: dict[str, torch.Tensor]):
        self._activations = dict(activations)

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._activations[name]
        except KeyError:
            raise KeyError(f"{name!r} is not in the cache; cached: {sorted(self._activations)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._activations)

    def __len__(self) -> int:
        return len(self._activations)

    def to(self, device: str | torch.device) -> ActivationCache:
        return ActivationCache({k: v.to(device) for k, v in self._activations.items()})

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self._activations.items())
        return f"ActivationCache({shapes})"


def _names_filter(names_filter) -> Callable[[str], bool]:
    """``None`` (all), a name or glob pattern, a list of them, or a predicate."""
    if names_filter is None:
        return lambda name: True
    if callable(names_filter):
        return names_filter
    patterns = [names_filter] if isinstance(names_filter, str) else list(names_filter)
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


class HookedModel(nn.Module):
    """The hook machinery and input checks shared by fvlib's models (the constrained
    :class:`~fvlib.models.FVTransformer`, the standard transformers of :mod:`fvlib.transformer`):
    a subclass builds its modules, then calls ``_register_hook_points``, which names every
    :class:`HookPoint` after its module path. Its ``config`` has the input dimension ``dim``."""

    def _register_hook_points(self) -> None:
        self._hook_points = {name: m for name, m in self.named_modules() if isinstance(m, HookPoint)}
        for name, hook_point in self._hook_points.items():
            hook_point.name = name

    def hook_names(self) -> list[str]:
        """All hook names in forward order (for :class:`~fvlib.models.FVTransformer`: per layer
        keys, phi, workspace; then theta_hat, prediction)."""
        return list(self._hook_points)

    def _check_hook_names(self, names: Iterable[str]) -> None:
        unknown = [n for n in names if n not in self._hook_points]
        if unknown:
            raise ValueError(f"unknown hook names {unknown}; known: {self.hook_names()}")

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[str, HookFn]] = ()):
        """Context manager that adds ``(name, fn)`` hooks and removes them on exit."""
        fwd_hooks = list(fwd_hooks)
        self._check_hook_names([name for name, _ in fwd_hooks])
        handles: list[HookHandle] = []
        try:
            for name, fn in fwd_hooks:
                handles.append(self._hook_points[name].add_hook(fn))
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def run_with_hooks(self, batch_or_x, *args, fwd_hooks: Iterable[tuple[str, HookFn]] = ()) -> torch.Tensor:
        """Forward pass (same arguments as ``forward``) with temporary hooks."""
        with self.hooks(fwd_hooks):
            return self(batch_or_x, *args)

    def run_with_cache(
        self, batch_or_x, *args, names_filter=None, detach: bool = True
    ) -> tuple[torch.Tensor, ActivationCache]:
        """Forward pass that records activations.

        Args:
            names_filter: ``None`` (all hooks), a name or glob pattern (``"blocks.*.hook_keys"``),
                a list of them, or a predicate on names.
            detach: detach the cached tensors from the autograd graph.

        Returns:
            ``(y_hat_q, cache)``; ``cache[name]`` is the activation *after* any hook on it.
        """
        keep = _names_filter(names_filter)
        activations: dict[str, torch.Tensor] = {}

        def record(tensor, hook):
            activations[hook.name] = tensor.detach() if detach else tensor

        names = [n for n in self.hook_names() if keep(n)]
        if isinstance(names_filter, (str, list, tuple)) and not names:
            raise ValueError(f"names_filter {names_filter!r} matches no hook; known: {self.hook_names()}")
        prediction = self.run_with_hooks(batch_or_x, *args, fwd_hooks=[(n, record) for n in names])
        return prediction, ActivationCache({n: activations[n] for n in names})

    # ----- inputs ----------------------------------------------------------------------
    def _inputs(self, batch_or_x, y, x_query) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x (B, N, D), y (B, N), x_query (B, D) or (B, Q, D))`` from a
        :class:`~fvlib.task.TaskBatch` or the three tensors, checked against ``config.dim`` and
        cast to the model's dtype; ``ValueError`` names a bad shape or a mix of the two forms.
        The three tensors given apart are checked by :func:`check_model_input` (a batch's come
        from :func:`~fvlib.task.sample_task`, which checks its inputs)."""
        if isinstance(batch_or_x, StatisticBatch):
            raise ValueError(f"{type(self).__name__} reads every token, not only the pooled statistic: pass a "
                             f"TaskBatch (tokens), not a StatisticBatch")
        if isinstance(batch_or_x, TaskBatch):
            if y is not None or x_query is not None:
                raise ValueError("pass either a TaskBatch or the tensors x, y, x_query, not both")
            x, y, x_query = batch_or_x.x, batch_or_x.y, batch_or_x.x_query
        else:
            x = check_model_input("x", batch_or_x)
            if y is None or x_query is None:
                raise ValueError("forward needs a TaskBatch or all of x, y, x_query")
            y, x_query = check_model_input("y", y), check_model_input("x_query", x_query)
        D = self.config.dim
        if x.ndim != 3 or x.shape[-1] != D:
            raise ValueError(f"x must have shape (B, N, {D}), got {tuple(x.shape)}")
        B, N, _ = x.shape
        if tuple(y.shape) != (B, N):
            raise ValueError(f"y must have shape {(B, N)}, got {tuple(y.shape)}")
        if x_query.shape[0] != B or x_query.shape[-1] != D or x_query.ndim not in (2, 3):
            raise ValueError(
                f"x_query must have shape ({B}, {D}) or ({B}, Q, {D}), got {tuple(x_query.shape)}"
            )
        dtype = next(self.parameters()).dtype
        return x.to(dtype), y.to(dtype), x_query.to(dtype)
