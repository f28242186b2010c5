"""fvlib.explorers.patching: the patching explorer reacts to the layer and the split level, for
the theory policy and a model."""

import pytest
import torch
from explorer_controls import changed

from fvlib import TreePrior
from fvlib.explorers.patching import patching_explorer
from fvlib.models import model_a


def test_patching_explorer_theory_reacts_to_layer_and_split():
    explorer = patching_explorer(TreePrior(3, 0.5), contexts=200, noise_std=0.5, layer=1)
    assert explorer.summary["ratio"] == pytest.approx(1.0, abs=0.05)  # l <= m: the patch is harmless
    before, after, old_png, new_png = changed(explorer, "layer", 3)
    assert after == before + 1 and new_png != old_png
    assert explorer.summary["ratio"] > 3  # l > m: the target is routed off its path
    # level by level: levels above the patched layer's node keep the target's coefficients
    assert explorer.summary["target_overlap"][0] == pytest.approx(1.0, abs=0.05)
    assert explorer.summary["target_overlap"][2] < 0.9
    explorer.controls["split_level"].value = 3
    assert explorer.summary["ratio"] == pytest.approx(1.0, abs=0.05)


def test_patching_explorer_with_a_model():
    torch.manual_seed(0)
    model = model_a(7, 3, width=16)
    explorer = patching_explorer(TreePrior(3, 0.5), model=model, contexts=50, layer=2)
    assert set(explorer.summary) >= {"ratio", "row", "target_overlap", "donor_overlap"}
    before, after, _, _ = changed(explorer, "split_level", 2)
    assert after == before + 1 and explorer.summary["split_level"] == 2


def test_patching_explorer_toggles_the_theory_reference():
    explorer = patching_explorer(TreePrior(3, 0.5), contexts=200, n_ctx=32, layer=2)
    aware = explorer.summary["ratio"]
    before, after, old_png, new_png = changed(explorer, "reference", "unaware")
    assert new_png != old_png
    # at N = 32 the unaware policy reads the donor's off-path node as its own: row m = 1 at l = 2
    # costs it more than the aware one, on the same pairs
    assert explorer.summary["ratio"] > 1.5 * aware
    explorer.controls["reference"].value = "aware"
    assert explorer.summary["ratio"] == aware
    with pytest.raises(ValueError, match="reference"):
        patching_explorer(TreePrior(3, 0.5), contexts=20, reference="both")
