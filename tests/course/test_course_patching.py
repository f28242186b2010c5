"""fvlib.course.patching: the key-patching heatmap and its qualitative mask, right and wrong."""

import pytest
import torch
from course_results import failed_with

from fvlib import TreePrior, make_generator
from fvlib.course import check_patching_sweep
from fvlib.theory import (
    FiniteSampleChannel,
    channel_tau2,
    ideal_patching_mask,
    patching_pairs,
    run_greedy,
    theory_patching_sweep,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def make_patching_student(score="target", forced_key=lambda l: l, transpose=False, patch=True):
    def student(tree, n_ctx, noise_std, n_layers, contexts, seed):
        gen = make_generator(seed + 1000)  # other random pairs than the reference
        tau2 = channel_tau2(tree, n_ctx, noise_std)
        out = torch.zeros(tree.depth, n_layers, dtype=torch.float64)
        for m in range(1, tree.depth + 1):
            target, donor = patching_pairs(tree, contexts, m, n_ctx, noise_std, gen)
            t_chan = FiniteSampleChannel(target.to("cpu", torch.float64).sufficient_statistic())
            d_chan = FiniteSampleChannel(donor.to("cpu", torch.float64).sufficient_statistic())
            d_nodes = run_greedy(tree, d_chan, n_layers, tau2).nodes
            truth = (target if score == "target" else donor).theta.double()
            for l in range(1, n_layers + 1):
                forced = {forced_key(l): d_nodes[:, l - 1]} if patch else None
                theta_hat = run_greedy(tree, t_chan, n_layers, tau2, forced=forced).theta_hat
                out[m - 1, l - 1] = ((theta_hat - truth) ** 2).sum(-1).mean()
        return out.T if transpose else out

    return student


def test_patching_right_function_and_heatmap():
    result = check_patching_sweep(make_patching_student())
    assert result and result.cases == 2, result
    heatmap = theory_patching_sweep(TreePrior(3, 0.5), 32, 0.5, 3, contexts=1000, seed=7)
    assert check_patching_sweep(heatmap)  # a PatchingResult from other pairs
    assert check_patching_sweep(heatmap.loss.numpy())


@pytest.mark.parametrize(
    "kwargs, diagnosis, words",
    [
        ({"score": "donor"}, "donor_scored", ("target",)),
        ({"transpose": True}, "transposed", ("transposed",)),
        ({"patch": False}, "no_effect", ("forced",)),
    ],
)
def test_patching_wrong_answers_are_named(kwargs, diagnosis, words):
    result = check_patching_sweep(make_patching_student(**kwargs))
    assert failed_with(result, diagnosis, "split level m", "layer l", *words), result


def test_patching_zero_based_layer_fails():
    # forced={l - 1: ...}: layer 1 is never patched and layer l - 1 gets the donor's layer-l node
    result = check_patching_sweep(make_patching_student(forced_key=lambda l: l - 1))
    assert failed_with(result, None, "split level m", "layer l", "expected"), result


def test_patching_qualitative_mask():
    assert check_patching_sweep(ideal_patching_mask(4, 3))
    m = torch.arange(1, 4)[:, None]
    l = torch.arange(1, 4)[None, :]
    assert failed_with(check_patching_sweep(l >= m), "l_ge_m", "l = m")
    assert failed_with(check_patching_sweep(m > l), "transposed", "rows")


def test_patching_bad_input():
    assert failed_with(check_patching_sweep(torch.zeros(2, 3)), None, "shape (2, 3)")
    assert failed_with(check_patching_sweep(lambda *a: torch.zeros(3)), None, "shape (3,)")
    with pytest.raises(ValueError, match="'heatmap'"):
        check_patching_sweep("heatmap")
    with pytest.raises(ValueError, match="contexts"):
        check_patching_sweep(make_patching_student(), contexts=10)
