"""Training models A, B, C on in-context regression (chapter 8, *Experiments*; the book's appendix *Conventions*,
section "Models A, B, C").

* Fresh contexts every step (infinite data) from a seeded :class:`torch.Generator`.
* Loss: the query-token loss ``(y_hat_q - y_q)^2``, averaged over the batch and over
  ``queries`` query tokens per context (the context's own query plus ``queries - 1`` extra
  ones drawn from the same law). Its expectation is ``sigma^2 + |theta_hat - theta|^2``
  whatever ``queries`` is; more query tokens only lower the gradient noise (one query
  token gives a rank-one, very noisy estimate of ``theta_hat - theta`` in ``D`` dimensions).
* Adam with a cosine learning-rate schedule ``lr_t = lr (1 + cos(pi t / steps)) / 2``.
* Evaluation on a fixed set of contexts drawn from a *separate* seed (``seed + 10_000``, or
  ``data_seed + 10_000``):
  the excess loss ``E|theta_hat - theta|^2`` and the query loss, which should agree up to
  ``sigma^2`` (``query_loss ~ noise_std^2 + excess_loss``).
* Deterministic on CPU: the same config gives bitwise the same numbers, and a run that is
  interrupted and resumed from its checkpoint ends exactly where an uninterrupted run ends.

* A run that diverges (a non-finite loss or weights, e.g. at too large a learning rate) stops
  with :class:`TrainingDiverged`; its directory keeps its last checkpoint, which was finite.

A run directory holds its config, weights, training state (Adam moments, RNG state) and
evaluation history; each checkpoint is written as one atomic step, listed in a manifest with
every file's size and SHA-256 and verified when read, and the directory is locked while it is
trained (:mod:`fvlib.training.rundir`). Nothing is ever unpickled: tensors go through safetensors,
scalars through JSON.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .._checks import check_int
from ..families import DEFAULT_FAMILY
from ..models import FVTransformer
from ..priors import Prior
from ..routers import training_progress
from ..task import StatisticBatch, TaskBatch, make_generator, sample_statistic_task, sample_task
from .checkpoint import check_same_run, checkpoint_step, save_checkpoint, stored_config, try_resume, write_config
from .config import (
    WARM_START_LR,
    WARM_START_SEED_OFFSET,
    TrainConfig,
    build_model,
    build_prior,
    lr_at,
    resolve_device,
    training_prior,
)
from .evaluate import evaluate_batches, run_eval_batches
from .rundir import MODEL_FILE, RunDirError, RunLock, check_run_dir, recover, start_over
from .warm_start import is_router_parameter, warm_start_router

__all__ = [
    "TrainingDiverged",
    "TrainingInterrupted",
    "interrupt_between_steps",
    "TrainResult",
    "sample_queries",
    "query_loss",
    "expected_query_loss",
    "sample_training_batch",
    "batch_inputs",
    "readers",
    "parameter_groups",
    "set_learning_rate",
    "training_step",
    "TrainingRun",
    "progress_shown",
    "train",
]

class TrainingDiverged(ValueError):
    """Training met a non-finite loss or non-finite weights (typically: the learning rate is
    too large); the run directory keeps its last checkpoint, written before that step."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped training between two steps; runs with a directory wrote their
    checkpoint at ``step`` first (``saved``), from which the same call resumes with the same
    numbers. ``where``: the directory, or the directories in words."""

    def __init__(self, where: Path | str | None, step: int):
        self.where, self.step, self.saved = where, step, where is not None
        kept = f"checkpoint written to {where}" if where is not None else "nothing saved"
        super().__init__(f"interrupted at step {step}; {kept}")

    def __reduce__(self):  # pickled whole (a worker process's interruption reaches its parent)
        return type(self), (self.where, self.step)


@contextmanager
def interrupt_between_steps() -> Iterator[Callable[[], bool]]:
    """Within the block, a first SIGINT only sets a flag, read with the function it yields
    (``True`` once Ctrl-C was pressed), so that the loop can stop between steps and checkpoint; a
    second one interrupts at once (a checkpoint being written stays atomic). Outside the main
    thread, or where SIGINT has another handler, nothing changes."""
    pressed = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield lambda: False
        return

    def handler(signum, frame):
        if pressed:
            raise KeyboardInterrupt
        pressed.append(signum)

    signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(pressed)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass
class TrainResult:
    """Outcome of :func:`train` (and of each run of :func:`fvlib.training.batched.train_many`).

    Attributes:
        model: the trained model (on the training device, in eval mode).
        config: the run's :class:`~fvlib.training.config.TrainConfig`.
        history: one dict per evaluation: ``step``, ``lr``, ``train_loss`` (mean query loss
            since the previous evaluation; ``None`` at step 0), ``eval_excess_loss``,
            ``eval_stderr``, ``eval_query_loss``, ``seconds`` (wall time since the start).
        final_loss: excess loss ``E|theta_hat - theta|^2`` on the evaluation set at the end.
        seconds: wall time of training (summed over resumptions).
        checkpoint: path of ``model.safetensors``, or ``None`` without ``out_dir``.
    """

    model: FVTransformer
    config: TrainConfig
    history: list[dict]
    final_loss: float
    seconds: float
    checkpoint: str | None


# ----------------------------------------------------------------------------------------
# One step
# ----------------------------------------------------------------------------------------
def sample_queries(
    batch: TaskBatch, queries: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's query plus ``queries - 1`` fresh query tokens per context.

    Returns ``x_query (B, Q, D)`` and ``y_query (B, Q)`` with ``y = <theta, x> + sigma eps``;
    column 0 is the batch's own query. Draws from ``generator`` (on the CPU).
    """
    B, D = batch.x_query.shape
    dtype = batch.x_query.dtype
    extra_x = torch.randn(B, queries - 1, D, generator=generator, dtype=dtype)
    eps = torch.randn(B, queries - 1, generator=generator, dtype=dtype)
    extra_y = torch.einsum("bqd,bd->bq", extra_x, batch.theta) + batch.noise_std * eps
    x_query = torch.cat([batch.x_query[:, None, :], extra_x], dim=1)
    y_query = torch.cat([batch.y_query[:, None], extra_y], dim=1)
    return x_query, y_query


def query_loss(predict, *inputs_and_target) -> torch.Tensor:
    """Mean ``(y_hat_q - y_q)^2`` over contexts and query tokens (the training objective).

    ``query_loss(model, x, y, x_query, y_query)`` on the tokens, or
    ``query_loss(model.forward_statistic, g, x_query, y_query)`` on the pooled statistic: the last
    argument is ``y_query``, the others go to ``predict``."""
    *inputs, y_query = inputs_and_target
    return ((predict(*inputs) - y_query) ** 2).mean()


def expected_query_loss(theta_hat_of, *inputs_theta_noise) -> torch.Tensor:
    """The expectation of ``query_loss`` over the query token, ``x_q ~ N(0, I)``: the mean
    over contexts of ``|theta_hat - theta|^2 + sigma^2`` (the objective of
    :attr:`~fvlib.training.config.TrainConfig.expected_loss`).

    ``expected_query_loss(model.predict_theta, x, y, x_query, theta, noise_std)`` on the tokens, or
    ``expected_query_loss(model.predict_theta_statistic, g, x_query, theta, noise_std)`` on the
    pooled statistic: the last two arguments are ``theta (B, D)`` and ``sigma``, the others go to
    ``theta_hat_of``."""
    *inputs, theta, noise_std = inputs_theta_noise
    theta_hat = theta_hat_of(*inputs)
    return ((theta_hat - theta.to(theta_hat.dtype)) ** 2).sum(-1).mean() + noise_std**2


def batch_inputs(batch: TaskBatch | StatisticBatch) -> tuple[torch.Tensor, ...]:
    """What a model reads of a batch: ``(x (B, N, D), y (B, N))`` of a :class:`~fvlib.task.TaskBatch`,
    ``(g (B, D),)`` of a :class:`~fvlib.task.StatisticBatch`."""
    return (batch.g,) if isinstance(batch, StatisticBatch) else (batch.x, batch.y)


def readers(model, statistic: bool) -> tuple:
    """``(predict, theta_hat_of)``: the model's prediction and ``theta_hat`` on the tokens
    (``forward``, ``predict_theta``) or on the pooled statistic (``forward_statistic``,
    ``predict_theta_statistic``), called with :func:`batch_inputs` then ``x_query``."""
    if statistic:
        return model.forward_statistic, model.predict_theta_statistic
    return model, getattr(model, "predict_theta", None)  # the standard transformers predict no theta_hat


def sample_training_batch(
    prior: Prior, config: TrainConfig, generator: torch.Generator
) -> tuple[TaskBatch, torch.Tensor | None, torch.Tensor | None]:
    """One step's data: ``(batch, x_query (B, Q, D), y_query (B, Q))`` on the CPU; with
    ``config.expected_loss``, ``(batch, None, None)`` (no query tokens are drawn). The batch is a
    :class:`~fvlib.task.StatisticBatch` when the config trains on the pooled statistic
    (:attr:`~fvlib.training.config.TrainConfig.inputs`), else a :class:`~fvlib.task.TaskBatch`."""
    sample = sample_statistic_task if config.statistic else sample_task
    batch = sample(prior, config.batch, config.n_ctx, config.noise_std, generator)
    if config.expected_loss:
        return batch, None, None
    x_query, y_query = sample_queries(batch, config.queries, generator)
    return batch, x_query, y_query


def parameter_groups(model, config: TrainConfig) -> list[dict]:
    """Adam's parameter groups: one group, or with a warm-started router
    (:attr:`~fvlib.training.config.TrainConfig.warm_starts`) the router's parameters
    (``blocks.*``) with ``lr_scale = router_lr_scale`` and the rest with ``lr_scale = 1``. Each
    group's learning rate is ``lr_scale * lr_at(step)``."""
    named = list(model.named_parameters())
    if not config.warm_starts:
        return [{"params": [p for _, p in named], "lr_scale": 1.0}]
    router = [p for name, p in named if is_router_parameter(name)]
    rest = [p for name, p in named if not is_router_parameter(name)]
    return [{"params": router, "lr_scale": config.router_lr_scale}, {"params": rest, "lr_scale": 1.0}]


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group at ``group["lr_scale"] * lr`` (see :func:`parameter_groups`)."""
    for group in optimizer.param_groups:
        group["lr"] = group.get("lr_scale", 1.0) * lr


def training_step(model, optimizer, batch: TaskBatch | StatisticBatch, x_query, y_query, lr: float) -> float:
    """One Adam step on the query-token loss at learning rate ``lr`` (times each parameter
    group's ``lr_scale``); returns the loss. ``x_query = y_query = None`` (the data of
    :attr:`~fvlib.training.config.TrainConfig.expected_loss`) takes the expected loss, :func:`expected_query_loss`.
    A :class:`~fvlib.task.StatisticBatch` is read on the statistic path."""
    device = next(model.parameters()).device
    set_learning_rate(optimizer, lr)
    inputs = tuple(t.to(device) for t in batch_inputs(batch))
    predict, theta_hat_of = readers(model, isinstance(batch, StatisticBatch))
    if x_query is None:
        loss = expected_query_loss(theta_hat_of, *inputs, batch.x_query.to(device), batch.theta.to(device),
                                   batch.noise_std)
    else:
        loss = query_loss(predict, *inputs, x_query.to(device), y_query.to(device))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


# ----------------------------------------------------------------------------------------
# A run and its loop
# ----------------------------------------------------------------------------------------
class TrainingRun:
    """The mutable state of one training run (model, optimiser, RNG, history)."""

    def __init__(self, config: TrainConfig, out_dir: Path | None, resume: bool, eval_batches=None):
        """``eval_batches``: the run's evaluation set if already drawn (see
        :func:`~fvlib.training.evaluate.eval_set_key`). A run with ``out_dir`` holds its
        directory's lock until :meth:`close`."""
        self.config, self.out_dir = config, out_dir
        if out_dir is not None:
            self._check_run_dir(resume)
        self.lock = RunLock(out_dir).acquire() if out_dir is not None else None  # before any work
        try:
            self._start(resume, eval_batches)
        except BaseException:
            self.close()
            raise

    def _check_run_dir(self, resume: bool) -> None:
        """Before the lock (which may wait on another process): ``out_dir`` holds nothing but a
        run's files, and, to be resumed, a run of this config (its ``config.json`` is written when
        the run starts)."""
        check_run_dir(self.out_dir)
        stored = stored_config(self.out_dir) if resume else None
        if stored is not None:
            try:
                step = checkpoint_step(self.out_dir)
            except RunDirError:  # no checkpoint yet, or one that reading it will name
                step = None
            check_same_run(self.out_dir, stored, self.config, step)

    def _start(self, resume: bool, eval_batches) -> None:
        config = self.config
        self.prior = build_prior(config)
        self.model = build_model(config).to(resolve_device(config.device))
        self.optimizer = torch.optim.Adam(parameter_groups(self.model, config), lr=config.lr)
        self.generator = make_generator(config.effective_data_seed)
        self.eval_batches = run_eval_batches(config) if eval_batches is None else eval_batches
        self.step, self.history = 0, []
        self.saved_step: int | None = None  # the step of the checkpoint in out_dir
        self.scalars = {"loss_sum": 0.0, "loss_count": 0, "seconds": 0.0}
        restored = self._open_run_dir(resume) if self.out_dir is not None else False
        if config.warm_starts and not restored:
            self._warm_start()
        self.start_time = time.perf_counter() - self.scalars["seconds"]

    def _warm_start(self) -> None:
        """Fit model A's router to the greedy policy before step 0 (:mod:`fvlib.training.warm_start`)."""
        start = time.perf_counter()
        c = self.config
        warm_start_router(self.model, self.prior, c.n_ctx, c.noise_std, steps=c.router_warm_start, batch=c.batch,
                          generator=make_generator(c.effective_data_seed + WARM_START_SEED_OFFSET), lr=WARM_START_LR)
        self.scalars["seconds"] += time.perf_counter() - start

    def _open_run_dir(self, resume: bool) -> bool:
        """Reopen the (locked) run directory; ``True`` when a checkpoint was restored."""
        recover(self.out_dir)  # a checkpoint whose renames a kill cut short is completed first
        restored = (
            try_resume(self.out_dir, self.config, self.model, self.optimizer, self.generator)
            if resume
            else None
        )
        if restored is None:
            start_over(self.out_dir)
            write_config(self.out_dir, self.config, self.model)
            return False
        self.step, self.history, self.scalars = restored
        self.saved_step = self.step
        return True

    def close(self) -> None:
        """Release the run directory's lock (the run can still give its :meth:`result`)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def diverged(self, what: str) -> None:
        """Stop training: raise :class:`TrainingDiverged` saying what is not finite and what the
        run directory keeps."""
        c = self.config
        if self.out_dir is None:
            kept = "nothing was saved"
        elif self.saved_step is None:
            kept = f"{self.out_dir} holds no checkpoint yet"
        else:
            kept = f"{self.out_dir} keeps its checkpoint of step {self.saved_step}"
        raise TrainingDiverged(f"model {c.model} (seed {c.seed}) diverged at step {self.step}: {what}; {kept}; "
                               f"try a smaller learning rate than {c.lr:g}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.start_time

    def train_step(self) -> None:
        prior = self.prior if self.config.alpha_start is None else training_prior(self.config, self.step)
        data = sample_training_batch(prior, self.config, self.generator)
        with training_progress(self.model.named_buffers(), self.step / self.config.steps):
            loss = training_step(self.model, self.optimizer, *data, lr=lr_at(self.step, self.config))
        self.count_step(loss)

    def count_step(self, loss: float) -> None:
        """Book a finished step and its training loss (:meth:`diverged` if it is not finite)."""
        self.step += 1
        if not math.isfinite(loss):
            self.diverged(f"the training loss is {loss}")
        self.scalars["loss_sum"] += loss
        self.scalars["loss_count"] += 1

    def eval_due(self) -> bool:
        return self.step % self.config.eval_every == 0 or self.step == self.config.steps

    def checkpoint_due(self, stop: int) -> bool:
        return self.step % self.config.checkpoint_every == 0 or self.step == stop

    def record_eval(self, result: dict | None = None) -> dict:
        """Evaluate the model (or book ``result``, its evaluation computed elsewhere)."""
        result = evaluate_batches(self.model, self.eval_batches) if result is None else result
        if not math.isfinite(result["excess_loss"]):
            self.diverged(f"the evaluation loss is {result['excess_loss']}")
        count = self.scalars["loss_count"]
        entry = {
            "step": self.step,
            "lr": lr_at(self.step, self.config),
            "train_loss": self.scalars["loss_sum"] / count if count else None,
            "eval_excess_loss": result["excess_loss"],
            "eval_stderr": result["stderr"],
            "eval_query_loss": result["query_loss"],
            "seconds": self.elapsed(),
        }
        self.history.append(entry)
        self.scalars["loss_sum"], self.scalars["loss_count"] = 0.0, 0
        return entry

    def checkpoint(self) -> None:
        """Save the run (only finite weights: :meth:`diverged` otherwise)."""
        if self.out_dir is not None:
            bad = [name for name, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())]
            if bad:
                self.diverged(f"the weights {bad[:3]} are not finite")
            self.scalars["seconds"] = self.elapsed()
            save_checkpoint(
                self.out_dir,
                self.step,
                self.model,
                self.optimizer,
                self.generator,
                self.history,
                self.scalars,
            )
            self.saved_step = self.step

    def result(self) -> TrainResult:
        """The outcome where training stopped (the model is put in eval mode)."""
        self.model.eval()
        return TrainResult(
            model=self.model,
            config=self.config,
            history=self.history,
            final_loss=self.final_loss(),
            seconds=self.elapsed(),
            checkpoint=str(self.out_dir / MODEL_FILE) if self.out_dir is not None else None,
        )

    def final_loss(self) -> float:
        if self.history[-1]["step"] == self.step:
            return self.history[-1]["eval_excess_loss"]
        return evaluate_batches(self.model, self.eval_batches)["excess_loss"]  # stopped between evaluations


def progress_shown(progress: bool) -> bool:
    """``progress`` unless the environment sets ``TQDM_DISABLE=1`` (tqdm's own switch, which its
    notebook bar does not read): ``make book`` sets it, so static pages hold no frozen bars."""
    return bool(progress) and os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true", "yes")


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike | None = None,
    resume: bool = True,
    progress: bool = True,
    *,
    until_step: int | None = None,
    callback: Callable[[dict], bool | None] | None = None,
    on_step: Callable[[int, torch.nn.Module], bool | None] | None = None,
) -> TrainResult:
    """Train ``config.model`` on fresh contexts and evaluate it on a fixed held-out set.

    Args:
        config: the run.
        out_dir: where checkpoints go (created if needed); ``None`` keeps everything in memory.
        resume: continue from a checkpoint in ``out_dir`` if there is one (same config
            required, except ``device`` and ``checkpoint_every``); ``False`` starts over.
        progress: show a tqdm progress bar (the notebook flavour inside Jupyter); the
            environment variable ``TQDM_DISABLE=1`` turns it off too.
        until_step: stop (with a checkpoint) after this step, as if interrupted; calling
            ``train`` again resumes. The schedule still runs to ``config.steps``.
        callback: called with each new history entry; returning ``True`` stops training
            there (with a checkpoint), e.g. once a target loss is reached.
        on_step: called after every step (after its evaluation, if one was due) with
            ``(step, model)``; returning ``True`` stops there, with a checkpoint, and a later
            call resumes with the same numbers. The model is in training mode; evaluating it
            (:func:`~fvlib.training.evaluate.evaluate`) changes nothing of the run. The
            training explorer uses it to stop within a step and to show extra evaluations
            early in a run.

    Returns:
        :class:`TrainResult`; ``final_loss`` is the excess loss on the evaluation set at the
        step where training stopped.

    Raises:
        RunDirError: (a ``ValueError``) ``out_dir`` is not writable, holds another config's
            run, or a checkpoint that is corrupt or cannot be written (:mod:`fvlib.training.rundir`);
            the message names the file. While another process trains ``out_dir``, ``train``
            waits for it (saying so on stderr), then resumes or reloads the run.
        TrainingDiverged: (a ``ValueError``) a non-finite loss or weights; ``out_dir`` keeps
            its last checkpoint.
    """
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
    stop = config.steps if until_step is None else until_step
    check_int("until_step", stop, 1, config.steps)
    run = TrainingRun(config, Path(out_dir) if out_dir is not None else None, resume)
    try:
        _train_run(run, stop, progress, callback, on_step)
    finally:
        run.close()
    return run.result()


def _train_run(run: TrainingRun, stop: int, progress: bool, callback, on_step=None) -> None:
    """The loop of :func:`train`: steps, evaluations and checkpoints up to step ``stop``."""
    config = run.config
    if not run.history:
        run.record_eval()
    run.model.train()
    arch_note = "" if config.arch == DEFAULT_FAMILY else f" ({config.arch})"
    bar = tqdm(total=config.steps, initial=run.step, disable=not progress_shown(progress),
               desc=f"model {config.model}{arch_note}", leave=False)
    try:
        with interrupt_between_steps() as interrupted:
            while run.step < stop:
                run.train_step()
                bar.update(1)
                stop_now = False
                if run.eval_due():
                    entry = run.record_eval()
                    bar.set_postfix(excess=f"{entry['eval_excess_loss']:.4f}")
                    stop_now = bool(callback(entry)) if callback is not None else False
                if not stop_now and on_step is not None:
                    stop_now = bool(on_step(run.step, run.model))
                if stop_now or run.checkpoint_due(stop) or interrupted():
                    run.checkpoint()
                if interrupted():
                    raise TrainingInterrupted(run.out_dir, run.step)  # after its checkpoint
                if stop_now:
                    break
    finally:
        bar.close()
