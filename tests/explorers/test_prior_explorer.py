"""fvlib.explorers.prior: the prior explorer redraws for a new depth and alpha."""

import pytest
from explorer_controls import changed

from fvlib.explorers.prior import prior_explorer


def test_prior_explorer_redraws_for_a_new_depth():
    explorer = prior_explorer()
    assert explorer.summary["dim"] == 15 and explorer.summary["nonzero"] == 4
    before, after, old_png, new_png = changed(explorer, "depth", 5)
    assert after == before + 1 and new_png != old_png
    assert explorer.summary["dim"] == 31 and explorer.summary["nonzero"] == 5
    assert "D = 31" in explorer.caption.value
    # the twin has the tree's energy per coordinate on average, not one non-zero per level
    assert sum(v != 0 for v in explorer.summary["twin_theta"]) == 31


def test_prior_explorer_alpha_scales_the_sample():
    explorer = prior_explorer(depth=3, alpha=0.5)
    level2 = max(abs(v) for v in explorer.summary["theta"][3:])  # coordinates 3..6 are level 2
    explorer.controls["alpha"].value = 0.25
    new_level2 = max(abs(v) for v in explorer.summary["theta"][3:])
    assert level2 == pytest.approx(0.5) and new_level2 == pytest.approx(0.25)  # alpha^(k/2), k = 2
