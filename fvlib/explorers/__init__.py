"""The book's six explorers: their states, their grids for the static page, their widgets.

An explorer shows, at each setting of its controls, a *state*: plain numbers computed by a
pure function of the control values. In Jupyter and Colab an ipywidgets explorer computes the
state on every change of a control and draws it; in the static book the same function is run
ahead of time on a grid of control values and the page's JavaScript draws the stored states.

The modules, in layers from the bottom up; a module imports only from the layers below it
(``tests/core/test_import_layers.py`` checks this, and that ``states`` and ``live`` import no widget
library, directly or through another fvlib module)::

    live        LiveSpec and Control: an explorer's grid of control values, its states computed
                on it and embedded in the page as JSON, drawn by _static/fvlib-live.js
    states      the six explorers' states (prior, strategy, training, patching, DP policy,
                layer split) and the grids they are embedded on
    base        the ipywidgets Explorer (controls above a figure, redrawn on every change; its
                HTML view for the static page) and the helpers of its controls
    prior, strategy, training, patching, dp_policy, layer_split
                the six ipywidgets explorers, one module each: prior_explorer (chapter 2),
                strategy_explorer (chapter 6), training_explorer (chapter 8),
                patching_explorer (chapter 10), dp_policy_explorer (chapter 4),
                layer_split_explorer (chapter 5)

This package imports none of them: ``from fvlib.explorers.prior import prior_explorer``
imports ipywidgets, ``from fvlib.explorers.states import prior_state`` does not.
"""
