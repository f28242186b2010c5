"""The optimised references of the stored experiments: best of several starts, their parameters
stored beside the result (results/NAME.theory.safetensors) and re-evaluated by `verify`."""

import json
import shutil

import pytest
import torch

from fvlib import TreePrior, experiments
from fvlib.experiments import references
from fvlib.experiments.definitions import constrained_config
from fvlib.experiments.provenance import cpu_name
from fvlib.experiments.records import new_result
from fvlib.experiments.references import reference_theory, tree_theory
from fvlib.experiments.storage import RESULTS_ENV, read_result, write_result
from fvlib.experiments.verify import check_theory
from fvlib.theory import (
    AdaptivePolicy,
    FiniteSampleChannel,
    FixedRows,
    GreedyRule,
    OptimisedPolicy,
    channel_tau2,
    evaluate_strategies,
    mc_contexts,
    optimise_adaptive_policy,
    optimise_directions,
    policy_from_state,
    policy_state,
)
from fvlib.training.rundir import tensors_from_bytes, tensors_to_bytes

pytestmark = pytest.mark.usefixtures("one_thread")

NAME = "depth-sweep-k6"   # stood in for by a K = 3 sweep without runs


def _stand_in(monkeypatch, directory, theory) -> None:
    """NAME defined with ``theory`` and no runs, its results in ``directory``, two starts."""
    monkeypatch.setitem(experiments.EXPERIMENTS, NAME, experiments.Experiment(NAME, "tiny", "x", (), theory))
    monkeypatch.setattr(references, "OPTIMISER_STARTS", 2)
    monkeypatch.setenv(RESULTS_ENV, str(directory))


def _sweep_theory():
    return tree_theory(3, 0.5, 32, 0.0, range(1, 4))


@pytest.fixture(scope="module")
def refreshed(tmp_path_factory):
    """The stored files of a K = 3 depth sweep (N = 32, budgets 1..3) under NAME, without runs,
    its references refreshed once (a few seconds)."""
    directory = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _stand_in(monkeypatch, directory, _sweep_theory())
        write_result(experiments.result_path(NAME), new_result(experiments.get_experiment(NAME)))
        experiments.refresh_theory(NAME)
    return directory


@pytest.fixture
def sweep(refreshed, monkeypatch, tmp_path):
    """A copy of the files of ``refreshed``, as the stored NAME; returns the result."""
    for path in refreshed.iterdir():
        shutil.copy(path, tmp_path / path.name)
    _stand_in(monkeypatch, tmp_path, _sweep_theory())
    return experiments.load_result(NAME)


def _rewrite_params(change) -> None:
    """Rewrite the stored sidecar with ``change(tensors, metadata)`` applied, and the result file
    beside it sealed again by the store's writer (as a change of fvlib's own would be)."""
    path = experiments.theory_params_path(NAME)
    tensors, metadata = tensors_from_bytes(path.read_bytes(), path)
    change(tensors, metadata)
    path.write_bytes(tensors_to_bytes(tensors, metadata))
    write_result(experiments.result_path(NAME), read_result(NAME, beside=False))


def test_policy_state_rebuilds_every_kind():
    tree, budget = TreePrior(3, 0.5), 3
    tau2 = channel_tau2(tree, 32, 0.0)
    Q = optimise_directions(tree, budget, tau2, steps=20)
    learned = optimise_adaptive_policy(tree, budget, tau2, directions=Q, steps=5, batch=32, validation=200,
                                       seed=1).learned
    for kind, kept in (("learned", learned), ("greedy", GreedyRule(tree)), ("nonadaptive_opt", FixedRows(Q))):
        policy = OptimisedPolicy(kept, kind, learned)
        state = policy_state(policy)
        saved = {"learned": set(learned.state_dict()), "greedy": set(), "nonadaptive_opt": {"rows"}}[kind]
        assert set(state) == {"kind"} | saved
        rebuilt = policy_from_state(tree, budget, state)
        assert rebuilt.kind == kind
        a, b = (policy.rollout(tree, FiniteSampleChannel(mc_contexts(tree, 300, 32, 0.0, seed=2)[2]), tau2)
                for policy in (policy, rebuilt))
        assert torch.equal(a.theta_hat, b.theta_hat) and torch.equal(a.directions, b.directions)
    with pytest.raises(ValueError, match="kind"):
        policy_from_state(tree, 3, {})
    with pytest.raises(ValueError, match="rows"):
        policy_from_state(tree, 3, {"kind": torch.tensor(2)})
    with pytest.raises(ValueError, match="base"):
        policy_from_state(tree, 3, {"kind": torch.tensor(0), "base": torch.zeros(2, 7, dtype=torch.float64)})


def test_the_sidecar_holds_every_optimised_reference_and_reproduces_it(sweep):
    data = sweep
    assert data["theory"]["optimiser_starts"] == 2 and data["theory"]["selection_seed"] == experiments.SELECTION_SEED
    tensors, metadata = experiments.load_theory_params(NAME)
    assert metadata["optimiser_starts"] == "2" and metadata["experiment"] == NAME
    for m in (1, 2, 3):
        assert tensors[f"M{m}/nonadaptive_opt/directions"].shape == (m, 7)
        assert f"M{m}/adaptive_opt/kind" in tensors
    selection = json.loads(metadata["selection"])
    assert selection["M2/nonadaptive_opt"]["seeds"] == [0, 1]
    # re-evaluated on the stored parameters: the very numbers stored (same CPU)
    params = experiments.TheoryParams(tensors, metadata, path="sidecar")
    assert experiments.get_experiment(NAME).theory(params) == data["theory"]
    assert set(params.tensors) == set(tensors)
    check = check_theory(NAME, experiments.load_result(NAME))
    assert check["differences"] == [] and check["checked"] > 30 and check["reoptimised"] is None


def test_a_changed_direction_or_number_fails_the_check(sweep, refreshed):
    def turn(tensors, metadata):                     # one direction of M2 changed
        Q = tensors["M2/nonadaptive_opt/directions"]
        Q[1] = torch.nn.functional.normalize(Q[1] + 0.2 * Q[0].roll(1), dim=0)

    _rewrite_params(turn)
    data = experiments.load_result(NAME)
    paths = [d["path"] for d in check_theory(NAME, data)["differences"]]
    assert "curves/nonadaptive_opt/mean/1" in paths and all(p.endswith("/1") for p in paths), paths
    stored_params = experiments.theory_params_path(NAME)
    shutil.copy(refreshed / stored_params.name, stored_params)  # as stored
    assert check_theory(NAME, data)["differences"] == []
    data["theory"]["curves"]["nonadaptive_coord"]["mean"][2] *= 1 + 1e-5   # a number of a fixed rule moved
    paths = [d["path"] for d in check_theory(NAME, data)["differences"]]
    assert paths == ["curves/nonadaptive_coord/mean/2"]


def test_a_missing_unreadable_or_foreign_sidecar_is_refused_naming_it(sweep):
    path = experiments.theory_params_path(NAME)
    data = experiments.load_result(NAME)
    _rewrite_params(lambda tensors, metadata: tensors.update(extra=torch.zeros(1)))
    with pytest.raises(experiments.ResultError, match="does not read: extra"):
        check_theory(NAME, data)
    _rewrite_params(lambda tensors, metadata: tensors.pop("M3/nonadaptive_opt/directions"))
    with pytest.raises(experiments.ResultError, match="M3/nonadaptive_opt/directions"):
        check_theory(NAME, data)
    _rewrite_params(lambda tensors, metadata: metadata.update(experiment="other"))
    with pytest.raises(experiments.ResultError, match="no theory parameters of experiment"):
        check_theory(NAME, data)
    path.write_bytes(b"not safetensors")
    with pytest.raises(experiments.ResultError, match=f"unreadable theory parameters {path}"):
        check_theory(NAME, data)
    path.unlink()
    with pytest.raises(experiments.ResultError, match=f"no stored theory parameters {path}"):
        check_theory(NAME, data)


def test_the_best_start_by_the_held_out_loss_is_kept(monkeypatch):
    """Three starts of which the second is best on the held-out contexts: it is kept, and the
    policy's starts begin at the kept directions."""
    tree, budget = TreePrior(3, 0.5), 3
    eye = torch.eye(7, dtype=torch.float64)
    rows = {0: eye[[3, 4, 5]], 1: eye[[0, 1, 2]], 2: eye[[0, 3, 4]]}   # leaves, the first levels, a mix
    monkeypatch.setattr(references, "optimise_directions", lambda tree_, m, tau2, seed: rows[seed])
    seen = []

    def policies(tree_, m, tau2, directions, seed):
        seen.append(directions)
        kept = {0: FixedRows(directions), 1: GreedyRule(tree), 2: FixedRows(rows[0])}[seed]
        return OptimisedPolicy(kept, {1: "greedy"}.get(seed, "nonadaptive_opt"), AdaptivePolicy(tree, m))

    monkeypatch.setattr(references, "optimise_adaptive_policy", policies)
    params = experiments.TheoryParams(starts=3)
    Q = params.directions("M3/nonadaptive_opt", tree, 32, 0.0, budget)
    policy = params.policy("M3/adaptive_opt", tree, 32, 0.0, budget, Q)

    def held_out(**given):
        name = "adaptive_opt" if "policy" in given else "nonadaptive_opt"
        return evaluate_strategies(tree, 32, 0.0, budget, samples=experiments.THEORY_SAMPLES,
                                   seed=experiments.SELECTION_SEED, strategies=(name,), **given)[name].mean

    losses = [held_out(directions=rows[s]) for s in range(3)]
    assert min(range(3), key=losses.__getitem__) == 1 and len(set(losses)) == 3
    assert torch.equal(Q, rows[1]) and params.selection["M3/nonadaptive_opt"] == {
        "seeds": [0, 1, 2], "held_out": losses, "kept": 1}
    assert all(d is Q for d in seen) and policy.kind == "greedy"
    chosen = params.selection["M3/adaptive_opt"]
    assert chosen["kept"] == 1 and chosen["held_out"][1] < min(chosen["held_out"][::2])
    assert params.tensors["M3/adaptive_opt/kind"] == 1


def test_a_reference_theory_shares_one_search_and_checks_each_copy(monkeypatch, tmp_path):
    """Model B's reference and the tree's nonadaptive_opt are one configuration: one search, two
    stored copies, each re-evaluated on its own."""
    task = dict(depth=3, alpha=0.5, n_ctx=32, noise_std=0.0, budget=2)
    refs = [constrained_config(v, prior="tree", **task) for v in ("A-warm", "B")]
    _stand_in(monkeypatch, tmp_path, reference_theory(task, refs))
    write_result(experiments.result_path(NAME), new_result(experiments.get_experiment(NAME)))
    theory = experiments.refresh_theory(NAME)["theory"]
    tensors, _ = experiments.load_theory_params(NAME)
    assert torch.equal(tensors["B/tree/directions"], tensors["tree/nonadaptive_opt/directions"])
    assert theory["B/tree"]["value"] == theory["tree"]["nonadaptive_opt"]["mean"]
    assert theory["A/tree"]["name"] == "adaptive_greedy" and theory["optimiser_starts"] == 2

    def turn(tensors, metadata):
        tensors["B/tree/directions"] = tensors["B/tree/directions"].roll(1, dims=1)

    _rewrite_params(turn)
    paths = [d["path"] for d in check_theory(NAME, experiments.load_result(NAME))["differences"]]
    assert paths == ["B/tree/stderr", "B/tree/value"]


def test_a_full_check_reoptimises_for_information_only(sweep, monkeypatch, capsys):
    """A re-optimisation that lands elsewhere (here: one start instead of the stored two) is
    reported with the CPU and never fails the check."""
    monkeypatch.setattr(references, "OPTIMISER_STARTS", 1)
    check = check_theory(NAME, sweep, full=True)
    assert check["differences"] == []
    info = check["reoptimised"]
    paths = [d["path"] for d in info["differences"]]
    assert info["cpu"] == cpu_name() and "optimiser_starts" in paths and len(paths) > 1
    assert f"re-optimised on {info['cpu']}" in capsys.readouterr().out
