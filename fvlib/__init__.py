"""fvlib: adaptive inference and function vectors in deep transformers.

The library behind the executable textbook. Modules, in layers from the bottom up; a module
imports only from the layers below it (``tests/core/test_import_layers.py`` checks this)::

    _checks, stats, registry, files, resources
                              argument checks of the public entry points; squared error, mean and
                              standard error, the relative gap of two estimates; one registry of
                              named kinds (priors, model families, strategies); files written in
                              one step and the exclusive lock of run directories and result files;
                              what memory there is (RAM, ulimit -v, cgroup, GPU)
    workers                   the process pool, whose workers end with their parent
    priors                    the tree prior, Gaussian priors, the Gaussian twin; the registry of
                              prior kinds
    task                      in-context regression contexts, labels and queries
    theory                    exact posteriors, strategies, dynamic programming, closed forms, fits,
                              the theory of key patching, Monte Carlo sweeps
    hooks                     hook points, handles, activation caches, one ``hook_name`` for every
                              model; the input checks the models share
    routers                   the routers of the constrained models (gated, linear, bilinear,
                              coord, MLP: a layer's keys from the token and the workspace) and
                              measure, the models' one contraction with their inputs
    models                    the constrained linear-attention transformer (models A, B, C)
    transformer               standard transformers (softmax attention, MLPs; bottlenecked and
                              open arrangements, models A' and B') with the same hooks
    families                  the registry of model families (TrainConfig.arch): each family's
                              config builder, model class and what code asks of it
    training                  training (one run and many at once, vmap), run directories and
                              checkpoints, evaluation, the imitation warm start
    interventions             key and state patching, the function-vector transplant, probes,
                              what the router measures, attention spread: written once, read out
                              per model family
    experiments               the book's in-build runs and the loops that train them; a trained
                              model beside the theory; the long experiments as named, resumable
                              jobs stored in results/NAME.json with provenance, their rules,
                              typed records and verification; the CLI's reproduce command
    plots                     the book's figures, drawn from results (they compute nothing)
    explorers                 the explorers: their states and the grids of control values
                              embedded in the static book (no widget library), and the
                              interactive explorers (ipywidgets)
    cli, course               the command line (its train flags are TrainConfig's fields); the
                              checks of the course's problem sets
    __main__                  ``python -m fvlib``

The conventions the code relies on (tree indexing, the channel and ``tau^2``, models A/B/C,
the split level, the CLI contract) are the book's appendix *Conventions*.
"""

__version__ = "0.1.0"

from .priors import GaussianPrior, TreePrior, make_prior  # noqa: E402
from .task import TaskBatch, make_generator, sample_task  # noqa: E402

# The heavier layers are imported on first use: ``fvlib.theory``, ``fvlib.routers``, ``fvlib.models``,
# ``fvlib.transformer``, ``fvlib.training``, ``fvlib.interventions``,
# ``fvlib.experiments``, ``fvlib.plots``, ``fvlib.explorers``.

__all__ = [
    "__version__",
    "GaussianPrior",
    "TreePrior",
    "make_prior",
    "TaskBatch",
    "make_generator",
    "sample_task",
]
