"""The model families a training run names (``TrainConfig.arch``), registered once each with what
code asks of them (the book's appendix *Conventions*, section "Models A, B, C"; chapter 11 for
the standard transformers).

A family is a set of model letters built by one architecture: ``"constrained"`` (models A, B, C
of :mod:`fvlib.models`), ``"transformer"`` (the bottlenecked standard transformer of
:mod:`fvlib.transformer`, models A' and B') and ``"transformer-open"`` (its open arrangement).
Each :class:`ModelFamily` holds the builder of a model's config from a run's numbers, the config
and model classes, and the facts that training, checkpoints and the interventions ask: whether
its models read only the pooled statistic (and so which input path a run takes by default),
whether they predict ``theta_hat``, which models take the router's imitation start and which a
choice of router (``TrainConfig.router``), the hook
family of :mod:`fvlib.hooks`. :func:`get_family` looks a family up by name, :func:`family_names`
lists them, and a new family is its module plus one :func:`register_family` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .hooks import FAMILIES, LAYER_HOOKS, MODEL_HOOKS
from .models import MODEL_KINDS, FVTransformer, ModelConfig, model_config
from .registry import Registry
from .transformer import (
    TRANSFORMER_KINDS,
    StandardTransformer,
    TransformerConfig,
    transformer_config,
)

__all__ = [
    "DEFAULT_FAMILY",
    "ModelFamily",
    "family_names",
    "family_of_config",
    "get_family",
    "register_family",
    "unregister_family",
]

#: The family of the runs saved before ``TrainConfig.arch`` existed (and the default): its runs'
#: directory names carry no family prefix.
DEFAULT_FAMILY = "constrained"

#: ``(model, dim, budget, width, hidden_layers) -> config``: a model's config from a run's numbers
#: (``width`` is ``d_model`` for the standard transformers, which do not use ``hidden_layers``).
ConfigBuilder = Callable[[str, int, int, int, int], object]


@dataclass(frozen=True)
class ModelFamily:
    """A registered model family.

    Attributes:
        name: the family's name, ``TrainConfig.arch``.
        models: the model letters it builds (``'A'``, ``'B'``, ...).
        config_class: the class of its models' configs (its ``from_dict`` reads a saved one).
        model_class: the class of its models, built from a config: ``model_class(config)``.
        build_config: the ``ConfigBuilder`` of a model's config.
        hook_family: its family of hook names in :data:`fvlib.hooks.FAMILIES`.
        reads_statistic: its models read a context only through its pooled statistic, so its
            runs train on the statistic by default (``TrainConfig.inputs``).
        predicts_theta: its models output ``theta_hat`` (the expected loss, and the learning
            recipe that trains on it, need that).
        warm_start_models: the models whose router the imitation warm start fits.
        router_models: the models whose router a run may choose (``TrainConfig.router``, one of
            :data:`fvlib.routers.MODEL_A_ROUTERS`; the family's config then carries it as ``router``).
        softmax_attention: its models hold ``N x N`` attention scores per context and layer.
        label_suffix: what follows the model letter in a model's label (``A'`` for ``"'"``).
        description: one line for listings.
    """

    name: str
    models: tuple[str, ...]
    config_class: type
    model_class: type
    build_config: ConfigBuilder
    hook_family: str
    reads_statistic: bool = False
    predicts_theta: bool = False
    warm_start_models: tuple[str, ...] = ()
    router_models: tuple[str, ...] = ()
    softmax_attention: bool = False
    label_suffix: str = ""
    description: str = ""

    @property
    def input_path(self) -> str:
        """The input path of the family's runs by default, ``'statistic'`` or ``'tokens'`` (what a
        run draws and its models read)."""
        return "statistic" if self.reads_statistic else "tokens"

    def model_label(self, model: str) -> str:
        """The label of model ``model`` of the family, e.g. ``"A"``, ``"A'"``, ``"A'-open"``."""
        return model + self.label_suffix

    def has_hook(self, kind: str) -> bool:
        """Whether the family's models have hook points of ``kind`` (:data:`fvlib.hooks.LAYER_HOOKS`,
        :data:`fvlib.hooks.MODEL_HOOKS`)."""
        return self.hook_family in {**LAYER_HOOKS, **MODEL_HOOKS}.get(kind, ())


_FAMILIES: Registry[ModelFamily] = Registry("model family", "arch")


def register_family(family: ModelFamily) -> ModelFamily:
    """Register ``family`` under its name; ``ValueError`` if the name is taken or its hook family unknown."""
    if family.hook_family not in FAMILIES:
        raise ValueError(f"hook_family must be one of {FAMILIES}, got {family.hook_family!r}")
    return _FAMILIES.add(family.name, family)


def unregister_family(name: str) -> None:
    """Remove the family ``name`` (``ValueError`` if it is not registered)."""
    _FAMILIES.remove(name)


def family_names() -> tuple[str, ...]:
    """The registered families' names, in the order they were registered."""
    return _FAMILIES.names()


def get_family(name: str) -> ModelFamily:
    """The registered family ``name``; ``ValueError`` naming ``name`` and the registered families."""
    return _FAMILIES.get(name)


def family_of_config(config) -> ModelFamily:
    """The first registered family whose models' configs are of ``config``'s class (the model of
    ``config`` is ``family_of_config(config).model_class(config)``)."""
    for family in _FAMILIES.entries():
        if isinstance(config, family.config_class):
            return family
    raise ValueError(f"no registered model family has configs of type {type(config).__name__}")


def _constrained_config(model: str, dim: int, budget: int, width: int, hidden_layers: int) -> ModelConfig:
    return model_config(model, dim, budget, width, hidden_layers)


def _transformer_config(arrangement: str, model: str, dim: int, budget: int, width: int,
                        hidden_layers: int) -> TransformerConfig:
    return transformer_config(model, dim, budget, arrangement, d_model=width)


register_family(ModelFamily(
    "constrained", MODEL_KINDS, ModelConfig, FVTransformer, _constrained_config, "constrained",
    reads_statistic=True, predicts_theta=True, warm_start_models=("A",), router_models=("A",),
    description="models A, B, C: constrained linear attention with a growing workspace"))
register_family(ModelFamily(
    "transformer", TRANSFORMER_KINDS, TransformerConfig, StandardTransformer,
    partial(_transformer_config, "bottlenecked"), "bottlenecked", softmax_attention=True, label_suffix="'",
    description="models A', B': standard transformers whose queries see the context only through a workspace"))
register_family(ModelFamily(
    "transformer-open", TRANSFORMER_KINDS, TransformerConfig, StandardTransformer,
    partial(_transformer_config, "open"), "open", softmax_attention=True, label_suffix="'-open",
    description="models A', B' in the open arrangement: queries attend to every context token"))
