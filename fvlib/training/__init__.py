"""Training models A, B, C and the standard transformers on in-context regression (chapter 8,
*Experiments*): one run (:func:`~fvlib.training.loop.train`), many at once
(:func:`~fvlib.training.batched.train_many`), their run directories and their evaluation.

The modules, in layers from the bottom up; a module imports only from the layers below it
(``tests/core/test_import_layers.py`` checks this)::

    rundir, config      run directories on disk (atomic checkpoints with a manifest of checksums,
                        the lock); TrainConfig, the recipes, what a config means at each step,
                        the model it builds and the name of its run directory
    evaluate            the per-context error, evaluation sets, a model's evaluation on them
    checkpoint          what a checkpoint holds, written, read and resumed; load_run
    warm_start          the router of model A fitted to the greedy policy (the imitation start)
    loop                one training step and the loop of one run: train; Ctrl-C checkpoints
    repair              the repair of a run directory without manifest: repair_run
    batched             many runs in one loop (stacked parameters, vmap): train_many

Everything a chapter or a user calls is importable from here: ``fvlib.training.train``,
``fvlib.training.TrainConfig``, ``fvlib.training.RECIPE``, ...
"""

from .batched import train_many
from .checkpoint import RunConfigMismatch, checkpoint_step, load_history, load_run
from .config import (
    ADDED_FIELDS,
    CURRICULUM_SHARE,
    EVAL_SEED_OFFSET,
    IMITATION_RECIPE,
    INPUT_PATHS,
    LEARNING_RECIPE,
    ORIGINAL_RECIPE,
    RECIPE,
    RESUMABLE_FIELDS,
    RUN_ROOT_ENV,
    TRANSFORMER_RECIPE,
    WARM_START_LR,
    WARM_START_SEED_OFFSET,
    TrainConfig,
    build_model,
    build_prior,
    curriculum_start,
    estimate_memory,
    lr_at,
    recipe_for,
    resolve_device,
    run_dir_for,
    run_root,
    training_prior,
)
from .evaluate import evaluate, per_context_losses
from .loop import (
    TrainingDiverged,
    TrainingInterrupted,
    TrainResult,
    expected_query_loss,
    parameter_groups,
    query_loss,
    sample_queries,
    sample_training_batch,
    set_learning_rate,
    train,
    training_step,
)
from .repair import repair_run
from .rundir import RunDirError, UnverifiedRunError, check_run_dir

__all__ = [
    "ADDED_FIELDS", "CURRICULUM_SHARE", "EVAL_SEED_OFFSET", "IMITATION_RECIPE", "INPUT_PATHS", "LEARNING_RECIPE",
    "ORIGINAL_RECIPE", "RECIPE", "RESUMABLE_FIELDS", "RUN_ROOT_ENV", "TRANSFORMER_RECIPE",
    "WARM_START_LR", "WARM_START_SEED_OFFSET", "TrainConfig", "build_model", "build_prior", "curriculum_start",
    "estimate_memory", "lr_at", "recipe_for", "resolve_device", "run_dir_for", "run_root", "training_prior",
    "evaluate", "per_context_losses",
    "checkpoint_step", "load_history", "load_run", "TrainingDiverged", "TrainResult", "expected_query_loss",
    "parameter_groups", "query_loss", "sample_queries", "sample_training_batch", "set_learning_rate", "train",
    "training_step", "train_many", "RunDirError", "TrainingInterrupted", "repair_run", "RunConfigMismatch",
    "UnverifiedRunError", "check_run_dir",
]
