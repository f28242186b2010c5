"""bayes_decode_nodes (one product for nodes shared by every context) gives the posterior mean of
the sequential Bayes update (log_likelihood_nodes), and refuses a bad tau2."""
import pytest
import torch

from fvlib import TreePrior, make_generator
from fvlib.theory.posteriors import log_likelihood_nodes, posterior_probs, tree_posterior_mean
from fvlib.theory.strategies import bayes_decode_nodes


@pytest.mark.parametrize("depth, nodes", [(3, [0, 2, 5]), (5, [4, 0, 17, 30, 9, 1])])
def test_the_product_form_is_the_sequential_update(depth, nodes):
    tree = TreePrior(depth, 0.5)
    nodes = torch.tensor(nodes)
    phis = torch.randn(200, len(nodes), dtype=torch.float64, generator=make_generator(3))
    sequential = tree_posterior_mean(tree, posterior_probs(
        log_likelihood_nodes(tree, nodes.expand(200, -1), phis, 0.07)))
    assert torch.allclose(bayes_decode_nodes(tree, nodes, phis, 0.07), sequential, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tau2", [0.0, -1.0, float("nan")])
def test_a_bad_tau2_is_refused(tau2):
    with pytest.raises(ValueError, match="tau2"):
        bayes_decode_nodes(TreePrior(3, 0.5), torch.tensor([0, 1]), torch.zeros(4, 2, dtype=torch.float64), tau2)
