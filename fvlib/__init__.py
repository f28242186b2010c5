"""fvlib: adaptive inference and function vectors in deep transformers.

The library behind the executable textbook. Modules, from the bottom up:

``priors`` -> ``task`` -> ``theory`` -> ``models`` -> ``train`` -> ``patching`` -> ``plots``
-> ``widgets``, with ``cli`` and ``course`` on top. Each imports only from layers below it.
Under all of them: ``_checks`` (the argument checks of the public entry points) and ``stats``
(squared error, mean and standard error).

The conventions the code relies on (tree indexing, the channel and ``tau^2``, models A/B/C,
the split level, the CLI contract) are the book's appendix *Conventions*.
"""

__version__ = "0.1.0"

from .priors import GaussianPrior, TreePrior, make_prior  # noqa: E402
from .task import TaskBatch, make_generator, sample_task  # noqa: E402

# The heavier layers are imported on first use: ``fvlib.theory``, ``fvlib.models``,
# ``fvlib.train``, ``fvlib.patching``, ``fvlib.plots``.

__all__ = [
    "__version__",
    "GaussianPrior",
    "TreePrior",
    "make_prior",
    "TaskBatch",
    "make_generator",
    "sample_task",
]
