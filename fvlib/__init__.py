"""fvlib: adaptive inference and function vectors in deep transformers.

The library behind the executable textbook. Modules, in layers from the bottom up; a module
imports only from the layers below it (``tests/test_import_layers.py`` checks this)::

    _checks, stats, files     argument checks of the public entry points; squared error, mean and
                              standard error, the relative gap of two estimates; files written in
                              one step and the exclusive lock of run directories and result files
    workers                   the process pool, whose workers end with their parent
    priors                    the tree prior, Gaussian priors, the Gaussian twin
    task                      in-context regression contexts, labels and queries
    theory                    exact posteriors, strategies, dynamic programming, closed forms, fits,
                              the theory of key patching
    hooks                     hook points, handles, activation caches, one ``hook_name`` for every
                              model; the input checks the models share
    models                    the constrained linear-attention transformer (models A, B, C)
    transformer               standard transformers (softmax attention, MLPs; bottlenecked and
                              open arrangements, models A' and B') with the same hooks
    training                  training (one run and many at once, vmap), run directories and
                              checkpoints, evaluation beside theory, the imitation warm start
    interventions             key and state patching, the function-vector transplant, probes,
                              attention spread: written once, read out per model family
    catalogue, analysis       the book's runs (shared runs, seeds, the depth sweep, the runs
                              trained ahead of the chapters) and the loops that train them; the
                              chapters' analyses (Monte Carlo sweeps, inside trained models, the
                              gap to the adaptive references)
    experiments               the book's long experiments as named, resumable jobs, stored in
                              results/NAME.json with provenance, and their verification; the CLI's
                              reproduce command
    plots                     the book's figures, drawn from results (they compute nothing)
    explorers                 the explorers: their states and the grids of control values
                              embedded in the static book (no widget library), and the
                              interactive explorers (ipywidgets)
    cli, course               the command line; the checks of the course's problem sets
    __main__                  ``python -m fvlib``

The conventions the code relies on (tree indexing, the channel and ``tau^2``, models A/B/C,
the split level, the CLI contract) are the book's appendix *Conventions*.
"""

__version__ = "0.1.0"

from .priors import GaussianPrior, TreePrior, make_prior  # noqa: E402
from .task import TaskBatch, make_generator, sample_task  # noqa: E402

# The heavier layers are imported on first use: ``fvlib.theory``, ``fvlib.models``,
# ``fvlib.transformer``, ``fvlib.training``, ``fvlib.interventions``,
# ``fvlib.catalogue``, ``fvlib.analysis``, ``fvlib.experiments``, ``fvlib.plots``, ``fvlib.explorers``.

__all__ = [
    "__version__",
    "GaussianPrior",
    "TreePrior",
    "make_prior",
    "TaskBatch",
    "make_generator",
    "sample_task",
]
