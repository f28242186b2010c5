"""patching_trends: the "split early" and "patch early" trends of a heatmap, counted cell
against neighbouring cell after the split."""

import pytest
import torch

from fvlib.interventions import patching_trends
from fvlib.theory.patching import PatchingResult


def _heatmap(loss, stderr):
    loss = torch.tensor(loss, dtype=torch.float64)
    return PatchingResult(baseline=0.01, baseline_stderr=0.001, baseline_by_level=torch.full((loss.shape[0],), 0.01),
                          loss=loss, stderr=torch.full_like(loss, stderr), donor_loss=loss, n_contexts=100)


# K = L = 3; cells after the split: (1, 2), (1, 3), (2, 3) in (m, l). Split early: (1, 3) vs
# (2, 3); patch early: (1, 2) vs (1, 3). The cells at or before the split are never compared.
LOSS = [[0.01, 0.50, 0.30],
        [0.01, 0.01, 0.20],
        [0.01, 0.01, 0.90]]


def test_trends_count_the_pairs_beyond_the_margin():
    trends = patching_trends(_heatmap(LOSS, 0.01))
    assert trends == {"split_early": {"held": 1, "reversed": 0, "tested": 1},
                      "patch_early": {"held": 1, "reversed": 0, "tested": 1}}


def test_a_difference_within_the_errors_is_neither_held_nor_reversed():
    trends = patching_trends(_heatmap(LOSS, 0.04))   # split: 0.1 / 0.08 = 1.25; patch: 0.2 / 0.08 = 2.5
    assert trends["split_early"] == {"held": 0, "reversed": 0, "tested": 1}
    assert trends["patch_early"]["held"] == 1


def test_reversed_trends_are_counted_as_reversed():
    reversed_loss = [[0.01, 0.10, 0.30], [0.01, 0.01, 0.60], [0.01, 0.01, 0.01]]
    trends = patching_trends(_heatmap(reversed_loss, 0.01))
    assert trends["split_early"] == {"held": 0, "reversed": 1, "tested": 1}
    assert trends["patch_early"] == {"held": 0, "reversed": 1, "tested": 1}


def test_larger_heatmaps_compare_every_neighbouring_pair_after_the_split():
    K = L = 5
    loss = [[0.01] * L for _ in range(K)]
    trends = patching_trends(_heatmap(loss, 0.01))
    # split early: columns l = 3..5 hold l - 2 pairs each; patch early: rows m = 1..3 hold L - m - 1
    assert trends["split_early"]["tested"] == 1 + 2 + 3
    assert trends["patch_early"]["tested"] == 3 + 2 + 1
    assert trends["split_early"]["held"] == trends["patch_early"]["reversed"] == 0


@pytest.mark.parametrize("z", [0, -1.0, float("nan")])
def test_z_must_be_positive(z):
    with pytest.raises(ValueError, match="z must be"):
        patching_trends(_heatmap(LOSS, 0.01), z=z)
