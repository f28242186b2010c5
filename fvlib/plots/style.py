"""The look shared by every figure of the book and the explorers: one palette, one colour per
model, one name per strategy.

* :data:`OKABE_ITO` -- the Okabe-Ito palette by colour name (colour-blind safe);
* :func:`palette` -- several palette colours by name, in the given order (the cycle of
  successive series in a figure);
* :data:`MODEL_COLORS` -- one colour per model A, B, C;
* :data:`STRATEGY_LABELS` -- the legend text of each strategy of
  :func:`fvlib.theory.strategies.evaluate_strategies`.

Change a colour or a label here and every chapter and explorer follows.
"""

from __future__ import annotations

__all__ = ["OKABE_ITO", "palette", "MODEL_COLORS", "VARIANT_STYLES", "variant_color", "STRATEGY_LABELS"]

#: The Okabe-Ito colour-blind-safe palette, by colour name.
OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
}


def palette(*names: str) -> tuple[str, ...]:
    """The palette colours ``OKABE_ITO[name]`` for ``names``, in that order."""
    unknown = [n for n in names if n not in OKABE_ITO]
    if unknown:
        raise ValueError(f"not Okabe-Ito colour names: {unknown}; choose from {sorted(OKABE_ITO)}")
    return tuple(OKABE_ITO[n] for n in names)


#: One colour per model, used by every figure of the experiment chapters and the explorers.
MODEL_COLORS = {"A": OKABE_ITO["green"], "B": OKABE_ITO["orange"], "C": OKABE_ITO["blue"]}

#: Colour, marker and legend text of the variants of the stored experiments (:mod:`fvlib.experiments`):
#: model A trained from scratch (RECIPE or the learning recipe), model A that first imitates the
#: greedy policy, and the controls' model A with each of its routers (:mod:`fvlib.routers`).
VARIANT_STYLES = {
    "A-scratch": dict(color=OKABE_ITO["green"], marker="o", label="model A, from scratch"),
    "A-warm": dict(color=OKABE_ITO["sky"], marker="s",
                   label="model A, imitation warm start (greedy)"),
    "A-learn": dict(color=OKABE_ITO["purple"], marker="v", label="model A, learning recipe"),
    "A": dict(color=OKABE_ITO["green"], marker="o", label="model A (MLP router)"),
    "A-bilinear": dict(color=OKABE_ITO["vermillion"], marker="P", label="model A, bilinear router (no hidden layer)"),
    "A-coord": dict(color=OKABE_ITO["sky"], marker="X", label="model A, one coordinate per layer"),
    "B": dict(color=OKABE_ITO["orange"], marker="D", label="model B"),
    "C": dict(color=OKABE_ITO["blue"], marker="^", label="model C"),
}


def variant_color(name: str) -> str:
    """The colour of a model (``"A"``) or a stored variant (``"A-warm"``); black if unknown."""
    if name in VARIANT_STYLES:
        return VARIANT_STYLES[name]["color"]
    return MODEL_COLORS.get(name, MODEL_COLORS.get(name.split("-")[0], "k"))

#: Legend text of the strategies of :func:`fvlib.theory.strategies.evaluate_strategies` (the
#: decoder in parentheses: the exact Bayes posterior or the best linear estimator).
STRATEGY_LABELS = {
    "adaptive_greedy": "adaptive greedy (Bayes)",
    "nonadaptive_coord": "non-adaptive coordinates (Bayes)",
    "lmmse": "non-adaptive coordinates (LMMSE)",
    "nonadaptive_opt": "non-adaptive, optimised directions",
    "nonadaptive_best_coord": "non-adaptive, noise-free best coordinate set (Bayes)",
    "adaptive_opt": "adaptive, optimised directions (Bayes)",
}
