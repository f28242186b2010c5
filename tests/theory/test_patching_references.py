"""The two theory references of key patching (fvlib.theory.patching_policies, issue 43 item 1):
the *aware* patched policy (its posterior knows which node slot l measured) and the *unaware*
one (it reads slot l as the measurement of the node its own workspace selects, as a network
does), for greedy and for direction policies, on the finite-N statistic and the Gaussian channel."""

import pytest
import torch

from fvlib import TreePrior, make_generator
from fvlib.theory import (
    PATCHING_REFERENCES,
    AdaptivePolicy,
    FiniteSampleChannel,
    FixedRows,
    GreedyRule,
    OptimisedPolicy,
    greedy_patcher,
    noisefree_patching_loss,
    patched_greedy_runs,
    policy_rollout,
    run_greedy,
    run_patching_sweep,
    theory_patching_references,
    theory_patching_row,
    theory_patching_sweep,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

#: The issue's independent simulation: K = 5, alpha = 1/2, Gaussian channel at N = 128,
#: 1200 pairs, split level m = 1, patched layer l = 1..5 (rounded as the issue gives them).
ISSUE_ROW = {"aware": [0.006, 0.116, 0.138, 0.116, 0.064], "unaware": [0.006, 0.69, 0.43, 0.24, 0.10]}


@pytest.fixture(scope="module")
def issue_sweeps():
    """Both references at the issue's configuration, on the same 1200 pairs per split level."""
    return theory_patching_references(TreePrior(5, 0.5), 128, 0.0, 5, contexts=1200, seed=0, channel="gaussian")


def _clean_readings_sweep(tree, reference, contexts, seed):
    """The greedy heatmap with noise-free readings (``g = theta``) and ``tau^2 = 1e-4`` in the
    likelihood (nearly noise-free); the pairs are drawn at a short context (only their latents
    are read)."""
    K, tau2 = tree.depth, 1e-4

    def run_pair(target, donor):
        target_chan, donor_chan = FiniteSampleChannel(target.theta.double()), FiniteSampleChannel(donor.theta.double())
        donor_nodes = run_greedy(tree, donor_chan, K, tau2).nodes
        clean = run_greedy(tree, target_chan, K, tau2).theta_hat
        patched = patched_greedy_runs(tree, target_chan, donor_nodes, K, tau2, range(1, K + 1), reference)
        return clean, patched, target, donor

    return run_patching_sweep(tree, K, 8, 0.0, contexts, seed, 500, run_pair)


def _noisy_limit(tree, split_level, reference):
    """Row ``m`` of the heatmap as ``tau -> 0`` with noisy readings: the proposition, except that
    the unaware policy patched at the last layer ``l = K`` reads the donor's off-path node (value 0
    plus noise) as its own last node (value ``+-alpha^((K-1)/2)``) and picks that sign from the
    noise with confidence: wrong half the time, ``2 alpha^(K-1)``."""
    row = noisefree_patching_loss(tree, split_level, tree.depth)
    if reference == "unaware" and split_level < tree.depth:
        row[-1] = 2 * tree.alpha ** (tree.depth - 1)
    return row


@pytest.mark.parametrize("reference", PATCHING_REFERENCES)
def test_both_references_equal_the_proposition_nearly_noise_free(reference):
    """tau^2 = 1e-4 with clean readings, K = 3 and 4: every row is alpha^(K-1) / 2^(K-l) after the
    split and 0 before (the issue's check)."""
    for K in (3, 4):
        tree = TreePrior(K, 0.5)
        sweep = _clean_readings_sweep(tree, reference, contexts=600, seed=K)
        for m in range(1, K + 1):
            expected = noisefree_patching_loss(tree, m, K)
            gap = (sweep.loss[m - 1] - expected).abs()
            assert (gap <= 4 * sweep.stderr[m - 1] + 1e-6).all(), (reference, K, m, sweep.loss[m - 1], expected)
        assert sweep.loss[0, 1:].min() > 0.02  # not vacuous: patches after the split cost


@pytest.mark.parametrize("reference", PATCHING_REFERENCES)
def test_noisy_readings_at_tau2_1e_4_reach_the_limit_of_each_reference(reference):
    """The Gaussian channel at tau^2 = 1e-4, K = 3: the aware heatmap is the proposition; the
    unaware one too but at l = K, where it is twice it (see _noisy_limit)."""
    tree = TreePrior(3, 0.5)
    patcher = greedy_patcher(tree, 3, 1e-4, range(1, 4), reference=reference, channel="gaussian",
                             generator=make_generator(1))
    sweep = run_patching_sweep(tree, 3, 8, 0.0, 800, 0, 500, patcher)
    for m in range(1, 4):
        expected = _noisy_limit(tree, m, reference)
        gap = (sweep.loss[m - 1] - expected).abs()
        assert (gap <= 4 * sweep.stderr[m - 1] + 1e-3).all(), (reference, m, sweep.loss[m - 1], expected)


@pytest.mark.parametrize("reference", PATCHING_REFERENCES)
def test_the_long_finite_statistic_reaches_the_same_limits(reference):
    """The finite-N statistic at N = 17500 (tau^2 = 1e-4 for K = 3, alpha = 1/2), row m = 1."""
    tree = TreePrior(3, 0.5)
    row = theory_patching_row(tree, [17500], 0.0, 3, split_level=1, contexts=400, seed=3, reference=reference)
    assert row.reference == reference
    expected = _noisy_limit(tree, 1, reference)
    assert ((row.loss[0] - expected).abs() <= 4 * row.stderr[0] + 1e-3).all(), (reference, row.loss)


def test_unaware_loss_at_layer_2_exceeds_aware_by_five_standard_errors(issue_sweeps):
    """K = 5, alpha = 1/2, N = 128 (Gaussian channel), m = 1, l = 2."""
    aware, unaware = issue_sweeps["aware"], issue_sweeps["unaware"]
    gap = unaware.loss[0, 1] - aware.loss[0, 1]
    stderr = (unaware.stderr[0, 1] ** 2 + aware.stderr[0, 1] ** 2).sqrt()
    assert gap > 5 * stderr, (unaware.loss[0], aware.loss[0], stderr)


@pytest.mark.parametrize("reference", PATCHING_REFERENCES)
def test_row_m1_matches_the_issues_independent_simulation(issue_sweeps, reference):
    """Within four standard errors of ours and the issue's (the same number of pairs), plus its rounding."""
    sweep = issue_sweeps[reference]
    expected = torch.tensor(ISSUE_ROW[reference], dtype=torch.float64)
    tolerance = 4 * 2**0.5 * sweep.stderr[0] + 0.005
    assert ((sweep.loss[0] - expected).abs() <= tolerance).all(), (reference, sweep.loss[0], expected)


def test_unaware_falls_with_the_layer_where_aware_does_not(issue_sweeps):
    """The unaware row at m = 1 falls from l = 2 to l = 5 (early patches hurt most); the aware
    one rises from l = 2 to l = 3."""
    unaware, aware = issue_sweeps["unaware"].loss[0], issue_sweeps["aware"].loss[0]
    assert (unaware[2:] < unaware[1:-1]).all(), unaware
    assert aware[2] > aware[1], aware


def test_unaware_equals_aware_where_the_patch_changes_nothing(issue_sweeps):
    """At l <= m the donor's node is (up to channel noise) the target's own: the two references
    agree within their errors, and exactly at l = 1 (both measure the root)."""
    aware, unaware = issue_sweeps["aware"], issue_sweeps["unaware"]
    assert torch.equal(aware.loss[:, 0], unaware.loss[:, 0])
    for m in range(2, 6):
        for l in range(2, m + 1):
            gap = (unaware.loss[m - 1, l - 1] - aware.loss[m - 1, l - 1]).abs()
            stderr = (unaware.stderr[m - 1, l - 1] ** 2 + aware.stderr[m - 1, l - 1] ** 2).sqrt()
            assert gap <= 4 * stderr + 1e-4, (m, l, aware.loss, unaware.loss)
    assert aware.baseline == unaware.baseline  # the same pairs, the same unpatched runs


def test_the_two_references_see_the_same_pairs_and_differ_only_after_the_split():
    """Alone or in one pass, each reference gives the same heatmap on the same pairs."""
    tree = TreePrior(3, 0.5)
    kw = {"contexts": 200, "seed": 4}
    aware = theory_patching_sweep(tree, 32, 0.1, 3, **kw)
    unaware = theory_patching_sweep(tree, 32, 0.1, 3, reference="unaware", **kw)
    both = theory_patching_references(tree, 32, 0.1, 3, **kw)
    for alone, joint in ((aware, both["aware"]), (unaware, both["unaware"])):
        assert torch.equal(alone.loss, joint.loss) and torch.equal(alone.stderr, joint.stderr)
        assert torch.equal(alone.donor_loss, joint.donor_loss) and alone.baseline == joint.baseline
    assert aware.baseline == unaware.baseline
    assert torch.equal(aware.loss[:, 0], unaware.loss[:, 0])
    after = torch.ones(3, 3, dtype=torch.bool).triu(1)  # l > m
    assert ((unaware.loss - aware.loss).abs()[after] > 0).all()


@pytest.mark.parametrize("reference", PATCHING_REFERENCES)
def test_greedy_as_a_direction_policy_gives_the_greedy_heatmap(reference):
    """The policy path (used for the optimised adaptive policy) reproduces greedy's, both references,
    both channels."""
    tree = TreePrior(3, 0.5)
    for channel in ("finite", "gaussian"):
        kw = {"contexts": 120, "seed": 2, "reference": reference, "channel": channel}
        ref = theory_patching_sweep(tree, 64, 0.0, 3, **kw)
        ours = theory_patching_sweep(tree, 64, 0.0, 3, policy=GreedyRule(tree), **kw)
        assert torch.allclose(ours.loss, ref.loss, rtol=1e-8, atol=1e-10), (reference, channel)


def _statistic(tree, contexts=64, seed=0):
    generator = make_generator(seed)
    theta = tree.theta_from_signs(tree.sample_signs(contexts, generator))
    return FiniteSampleChannel(theta + 0.2 * torch.randn(theta.shape, generator=generator, dtype=torch.float64))


@pytest.mark.parametrize("policy_kind", ["fixed", "adaptive"])
def test_true_readings_change_nothing(policy_kind):
    """Overwriting a slot with the reading the policy would have taken anyway reproduces the
    unpatched rollout, for rows that are not orthogonal (the likelihood is then computed from the
    workspace alone)."""
    tree = TreePrior(3, 0.5)
    chan = _statistic(tree)
    if policy_kind == "fixed":
        policy = FixedRows(torch.randn(3, tree.dim, generator=make_generator(1), dtype=torch.float64))
    else:
        torch.manual_seed(0)
        policy = AdaptivePolicy(tree, 3, width=8, greedy_start=True)
        for p in policy.parameters():
            p.data.add_(0.2 * torch.randn_like(p))
    with torch.no_grad():
        clean = policy_rollout(tree, policy, chan, 3, 0.05)
        for l in (1, 2, 3):
            replayed = policy_rollout(tree, policy, chan, 3, 0.05, readings={l: clean.phis[:, l - 1]})
            assert torch.allclose(replayed.log_w, clean.log_w, atol=1e-8), l
            assert torch.allclose(replayed.phis, clean.phis, atol=1e-10)


def test_unaware_greedy_reads_the_given_value_as_its_own_node():
    """At the patched layer the node is the policy's own choice and the workspace holds the given value."""
    tree = TreePrior(3, 0.5)
    chan = _statistic(tree)
    clean = run_greedy(tree, chan, 3, 0.05)
    fake = torch.full((64,), 0.3, dtype=torch.float64)
    patched = run_greedy(tree, chan, 3, 0.05, readings={2: fake})
    assert torch.equal(patched.nodes[:, :2], clean.nodes[:, :2])
    assert torch.equal(patched.phis[:, 1], fake)
    assert not torch.equal(patched.log_w, clean.log_w)


@pytest.mark.parametrize("bad", [{"reference": "blind"}, {"reference": ("aware",)}, {"channel": "exact"}])
def test_sweep_rejects_an_unknown_reference_or_channel(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        theory_patching_sweep(TreePrior(2, 0.5), 8, 0.0, 2, contexts=4, **bad)


@pytest.mark.parametrize("references", [(), ("aware", "aware"), ("aware", "blind")])
def test_references_rejects_an_empty_repeated_or_unknown_list(references):
    with pytest.raises(ValueError, match="reference"):
        theory_patching_references(TreePrior(2, 0.5), 8, 0.0, 2, contexts=4, references=references)


def test_optimised_policy_sweep_in_both_references():
    """An OptimisedPolicy (here a perturbed, untrained AdaptivePolicy kept as "learned") runs in
    both references on the same pairs: layer 1 (no workspace, the same row for donor and target)
    changes nothing in either, the two differ after the split."""
    tree = TreePrior(3, 0.5)
    torch.manual_seed(0)
    learned = AdaptivePolicy(tree, 3, width=8, greedy_start=True)
    for p in learned.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    policy = OptimisedPolicy(learned.eval(), "learned", learned)
    kw = {"contexts": 100, "seed": 5, "policy": policy}
    aware = theory_patching_sweep(tree, 32, 0.1, 3, **kw)
    unaware = theory_patching_sweep(tree, 32, 0.1, 3, reference="unaware", **kw)
    for sweep in (aware, unaware):
        assert torch.allclose(sweep.loss[:, 0], sweep.baseline_by_level)
    after = torch.ones(3, 3, dtype=torch.bool).triu(1)
    assert ((unaware.loss - aware.loss).abs()[after] > 1e-9).all()


def test_a_fixed_policy_is_immune_to_key_patching_in_both_references():
    """Non-adaptive rows are the same for donor and target: no patch changes anything."""
    tree = TreePrior(3, 0.5)
    rows = FixedRows(torch.randn(3, tree.dim, generator=make_generator(3), dtype=torch.float64))
    for reference in PATCHING_REFERENCES:
        sweep = theory_patching_sweep(tree, 32, 0.1, 3, contexts=60, seed=1, policy=rows, reference=reference)
        assert torch.allclose(sweep.loss, sweep.baseline_by_level[:, None].expand(3, 3), rtol=1e-9), reference
