"""The book's long experiments as named, resumable jobs, stored in ``results/NAME.json``.

``python -m fvlib experiment run NAME`` trains an experiment of
:data:`~fvlib.experiments.definitions.EXPERIMENTS` into ``results/NAME.json``
(:func:`~fvlib.experiments.runner.run`), which the chapters read (``from fvlib import experiments``;
:func:`~fvlib.experiments.storage.load_result`, :func:`~fvlib.experiments.runner.stored` and the
readers: :func:`~fvlib.experiments.readers.point_rows`,
:func:`~fvlib.experiments.readers.depth_sweep_of`, :func:`~fvlib.experiments.readers.decay_fits`,
...) and CI re-checks (``experiment verify NAME``, :func:`~fvlib.experiments.verify.verify`).
An experiment may keep the final weights of some runs beside its file
(``results/NAME.models.safetensors``), which a chapter loads instead of training its own:
:func:`~fvlib.experiments.kept_models.load_stored_model`.

Modules, in layers from the bottom up; a module imports only from the layers below it
(``tests/core/test_import_layers.py`` checks this)::

    inbuild, beside_theory, rules, provenance, seal
                              the chapters' in-build runs (shared runs, seeds, the depth sweep,
                              the runs trained ahead of the chapters) and the loops that train
                              them; a trained model beside the theory (matching baselines, greedy
                              on the same contexts, the gap to the adaptive references); the rules
                              (convergence, doubling, tolerances, failure) and their functions;
                              where and how a run was computed; the seal of a result file
    reproduce, records        ``python -m fvlib reproduce`` (the headline results as JSON files);
                              the result file as typed records, checked field by field (version 3)
    references                the theory references and their optimised parameters (TheoryParams)
    definitions               the named experiments (Run, Experiment, EXPERIMENTS)
    storage                   where the result files live; reading (checked, seal included),
                              writing (sealed), locking and sealing them
    readers, kept_models      what the chapters read: tables, sweeps, fits; the trained models
                              an experiment keeps (loaded, added, re-checked and written)
    runner                    training an experiment (run, refresh_theory, stored)
    verify                    checking a stored experiment against today's code

The process pool of ``--jobs`` and of ``warm`` is :func:`fvlib.workers.worker_pool`; files are
written and locked through :mod:`fvlib.files`.
"""

from .definitions import (
                          CONTROL_VARIANTS,
                          EXPERIMENTS,
                          RECIPE_STEPS,
                          TRANSFORMER_RECIPE_STEPS,
                          Experiment,
                          Run,
                          controls_config,
                          estimate_seconds,
                          experiment_names,
                          get_experiment,
                          run_key,
)
from .kept_models import keep_models, load_stored_model, stored_model_keys
from .provenance import provenance, provenance_line, provenance_summary
from .readers import (
                          CONTROL_CURVES,
                          CONTROL_REFERENCES,
                          attempt_loss,
                          controls_panels,
                          controls_rows,
                          decay_fits,
                          depth_sweep_of,
                          point_rows,
                          summarise,
                          sweep_table_rows,
                          theory_curves,
)
from .records import ResultError, ResultFile, RunRecord
from .references import (
                          LARGE_THEORY_SAMPLES,
                          OPTIMISER_STARTS,
                          SELECTION_SEED,
                          THEORY_SAMPLES,
                          TheoryParams,
                          finite_n_floor,
                          twin_closed_form,
)
from .rules import (
                          CONVERGENCE_DROP,
                          CONVERGENCE_RULES,
                          FAILURE_COORD_FRACTION,
                          FAILURE_RULE,
                          FINAL_RTOL,
                          MAX_DOUBLINGS,
                          PREFIX_RTOL,
                          PREFIX_RULE,
                          THEORY_TOLERANCE_RULE,
                          TOLERANCE_RULE,
                          converged,
                          doubling_gain,
                          failed,
                          last_fifth_drop,
                          paired_converged,
                          paired_drop,
                          runs_to_double,
)
from .runner import GAP_CONTEXTS, refresh_theory, run, stored
from .storage import (
                          check_results_dir,
                          load_result,
                          load_theory_params,
                          models_path,
                          read_result,
                          result_path,
                          results_dir,
                          seal_result,
                          theory_params_path,
)
from .verify import prefix_runs, theory_differences, verify

__all__ = [
    "CONTROL_CURVES",
    "CONTROL_REFERENCES",
    "CONTROL_VARIANTS",
    "CONVERGENCE_DROP",
    "CONVERGENCE_RULES",
    "EXPERIMENTS",
    "Experiment",
    "FAILURE_COORD_FRACTION",
    "FAILURE_RULE",
    "FINAL_RTOL",
    "GAP_CONTEXTS",
    "LARGE_THEORY_SAMPLES",
    "MAX_DOUBLINGS",
    "OPTIMISER_STARTS",
    "PREFIX_RTOL",
    "PREFIX_RULE",
    "RECIPE_STEPS",
    "ResultError",
    "ResultFile",
    "Run",
    "RunRecord",
    "SELECTION_SEED",
    "THEORY_SAMPLES",
    "THEORY_TOLERANCE_RULE",
    "TOLERANCE_RULE",
    "TRANSFORMER_RECIPE_STEPS",
    "TheoryParams",
    "attempt_loss",
    "check_results_dir",
    "controls_config",
    "controls_panels",
    "controls_rows",
    "converged",
    "decay_fits",
    "depth_sweep_of",
    "doubling_gain",
    "estimate_seconds",
    "experiment_names",
    "failed",
    "finite_n_floor",
    "get_experiment",
    "keep_models",
    "last_fifth_drop",
    "load_result",
    "load_stored_model",
    "load_theory_params",
    "models_path",
    "paired_converged",
    "paired_drop",
    "point_rows",
    "prefix_runs",
    "provenance",
    "provenance_line",
    "provenance_summary",
    "read_result",
    "refresh_theory",
    "result_path",
    "results_dir",
    "run",
    "run_key",
    "runs_to_double",
    "seal_result",
    "stored",
    "stored_model_keys",
    "summarise",
    "sweep_table_rows",
    "theory_curves",
    "theory_differences",
    "theory_params_path",
    "twin_closed_form",
    "verify",
]
