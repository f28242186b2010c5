"""The registries of prior kinds, model families and strategies: a prior added through the registry
alone trains end to end, and unknown names fail with a ValueError naming them."""

import json
import math

import pytest
import torch

from fvlib.families import DEFAULT_FAMILY, family_names, get_family
from fvlib.priors import (
    GaussianPrior,
    TreePrior,
    get_prior_kind,
    make_prior,
    prior_kinds,
    register_prior,
    unregister_prior,
)
from fvlib.theory import (
    choosing_strategies,
    evaluate_strategies,
    get_strategy,
    strategy_names,
)
from fvlib.training import TrainConfig, load_run, recipe_for, train


def toy_prior(depth: int, alpha: float) -> GaussianPrior:
    """A Gaussian whose variances decay along the coordinates, ``alpha^(n / D)`` for coordinate ``n``
    of ``D = 2^K - 1`` (another covariance than the tree's twin)."""
    dim = TreePrior(depth, alpha).dim  # validates depth and alpha
    variances = alpha ** (torch.arange(dim, dtype=torch.float64) / dim)
    return GaussianPrior(torch.diag(variances), name="toy")


@pytest.fixture
def toy():
    """The prior kind ``"toy"``, registered for one test and removed after it."""
    register_prior("toy", toy_prior, "a Gaussian with decaying variances (test only)")
    yield "toy"
    unregister_prior("toy")


def test_the_built_in_kinds_are_registered_once():
    assert prior_kinds()[:3] == ("tree", "gaussian-twin", "gaussian")
    assert "toy" not in prior_kinds()
    assert get_prior_kind("tree").is_tree and make_prior("tree", 3).is_tree
    assert not get_prior_kind("gaussian-twin").is_tree and not make_prior("gaussian", 3).is_tree
    with pytest.raises(ValueError, match="already registered"):
        register_prior("tree", TreePrior)


def test_a_prior_added_through_the_registry_trains(toy, tmp_path):
    assert toy in prior_kinds() and not get_prior_kind(toy).is_tree
    config = TrainConfig(model="B", prior=toy, depth=3, n_ctx=16, budget=3, steps=6, batch=16, queries=4, width=8,
                         eval_every=3, eval_contexts=32, checkpoint_every=6, device="cpu")
    result = train(config, out_dir=tmp_path, progress=False)
    assert math.isfinite(result.final_loss)
    assert all(math.isfinite(entry["eval_excess_loss"]) for entry in result.history)
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    model, loaded, _ = load_run(tmp_path)
    assert loaded == config and isinstance(model, get_family(config.arch).model_class)
    assert "alpha_start" not in recipe_for(config.arch, toy)  # the tree curriculum is the tree's alone
    with pytest.raises(ValueError, match="tree prior"):
        TrainConfig(prior=toy, depth=3, budget=3, alpha_start=0.7)


def test_unknown_names_fail_naming_the_value_and_the_registered_ones():
    with pytest.raises(ValueError, match="'nope'") as err:
        make_prior("nope", 3)
    assert "'nope'" in str(err.value) and "'gaussian'" in str(err.value)
    with pytest.raises(ValueError, match="'nope'"):
        TrainConfig(prior="nope")
    with pytest.raises(ValueError, match="'nope'"):
        unregister_prior("nope")
    with pytest.raises(ValueError, match=r"'constrained'.*'nope'"):
        TrainConfig(arch="nope")
    with pytest.raises(ValueError, match=r"'adaptive_greedy'.*'nope'"):
        get_strategy("nope")
    with pytest.raises(ValueError, match="unknown strategies"):
        evaluate_strategies(TreePrior(3, 0.5), 16, 0.0, 2, strategies=("nope",))


def test_families_and_strategies_say_what_code_asks():
    assert family_names() == ("constrained", "transformer", "transformer-open") and DEFAULT_FAMILY == "constrained"
    constrained, open_family = get_family("constrained"), get_family("transformer-open")
    assert constrained.models == ("A", "B", "C") and get_family("transformer").models == ("A", "B")
    assert constrained.input_path == "statistic" and open_family.input_path == "tokens"
    assert constrained.has_hook("theta_hat") and not open_family.has_hook("workspace")
    assert open_family.model_label("A") == "A'-open"
    assert choosing_strategies() == ("adaptive_greedy", "adaptive_opt")
    assert set(choosing_strategies()) < set(strategy_names())
    assert get_strategy("adaptive_opt").needs == {"policy"} and get_strategy("adaptive_opt").channels == ("finite",)


def test_the_command_line_offers_a_registered_prior(toy):
    from fvlib.cli import build_parser
    from fvlib.cli.limits import CliError
    from fvlib.cli.train_flags import train_config

    argv = ["train", "--model", "B", "--prior", toy, "--depth", "3", "--budget", "3", "--n-ctx", "16",
            "--steps", "10", "--out", "run"]
    args = build_parser().parse_args(argv)
    assert train_config(args).prior == toy
    unregister_prior(toy)
    try:
        with pytest.raises(CliError, match="'toy'"):
            build_parser().parse_args(argv)
    finally:
        register_prior(toy, toy_prior)


def test_a_registry_refuses_a_taken_name_and_names_what_it_holds():
    from fvlib.registry import Registry

    registry = Registry("colour", "colour")
    assert registry.add("red", 1) == 1 and registry.names() == ("red",) and registry.entries() == (1,)
    with pytest.raises(ValueError, match="already registered"):
        registry.add("red", 2)
    with pytest.raises(ValueError, match="non-empty string"):
        registry.add("", 3)
    with pytest.raises(ValueError, match=r"colour must be one of \('red',\), got 'blue'"):
        registry.get("blue")
    registry.remove("red")
    assert registry.names() == ()
