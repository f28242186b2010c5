"""Figures for the book: one submodule per topic, matplotlib only.

Every function draws results it is given (computed by the layers below: ``fvlib.theory``,
:mod:`fvlib.interventions`, :mod:`fvlib.experiments`) on a given (or new) axes
or figure and returns
what it drew, so chapters stay short and figures look the same everywhere. Nothing here trains
a model, samples contexts or runs a Monte Carlo estimate.

Submodules, in layers from the bottom up; a submodule imports only from the layers below it
(``tests/core/test_import_layers.py`` checks this)::

    style, tables, text
        the Okabe-Ito palette, one colour per model, one label per strategy; tables of results
        (HTML in the book, aligned text elsewhere); computed numbers in a page's text (glue)
    architecture, channel, decay, interventions, training, transformers, trees
        the figures of the chapters, by topic
    explorers
        the figures of the explorers of fvlib.explorers, for chapters too
"""
