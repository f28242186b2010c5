"""fvlib.explorers.layer_split: the layer split explorer redraws with each control and never
shows more layers than measurements."""

import pytest

from fvlib.explorers.layer_split import layer_split_explorer
from fvlib.explorers.states import layer_split_state


def test_layer_split_explorer_redraws_with_each_control():
    e = layer_split_explorer()
    assert e.summary == layer_split_state(6, 2, 0.5)
    for name, value in (("layers", 6), ("budget", 8), ("alpha", 0.9)):
        before, png = e.updates, e.image.value
        e.controls[name].value = value
        assert e.updates == before + 1 and e.image.value != png, name
    assert e.summary == layer_split_state(8, 6, 0.9)
    assert "L = 6" in e.caption.value
    # never more layers than measurements: the layers follow a budget that falls below them,
    # and cannot be moved past it
    drawn = []
    show = e.show
    e.show = lambda *args: (drawn.append((e.controls["budget"].value, e.controls["layers"].value)), show(*args))
    e.controls["budget"].value = 3
    assert e.controls["layers"].value == 3 and e.summary["layer_sizes"] == [1, 1, 1]
    e.controls["layers"].value = 5
    assert e.controls["layers"].value == 3 and e.summary == layer_split_state(3, 3, 0.9)
    assert drawn and all(layers <= budget for budget, layers in drawn)
    with pytest.raises(ValueError, match="layers"):
        layer_split_explorer(budget=2, layers=3)
    with pytest.raises(ValueError, match="layers"):
        layer_split_explorer(layers=13)
