"""fvlib.explorers.dp_policy: the DP policy explorer redraws with tau."""

import pytest

from fvlib.explorers.dp_policy import dp_policy_explorer
from fvlib.explorers.states import dp_policy_state


def test_dp_policy_explorer_redraws_with_tau():
    e = dp_policy_explorer()
    assert e.summary == dp_policy_state(0.6)
    before, png = e.updates, e.image.value
    e.controls["tau"].value = 0.1
    assert e.updates == before + 1 and e.image.value != png
    assert e.summary["first_node"] != 0 and "tau = 0.1" in e.caption.value
    assert '<div class="fvlib-explorer">' in e._repr_mimebundle_()["text/html"]
    with pytest.raises(ValueError, match="tau"):
        dp_policy_explorer(0.7)
