"""Training many models at once (chapter 8, *Experiments*): seeds, budgets and kinds in one loop.

``train_many(configs, out_dirs)`` trains every config as :func:`fvlib.training.loop.train` would,
but in one loop: the models of one architecture are stacked (``torch.func.stack_module_state``)
and take each Adam step together, as one ``torch.func.vmap`` of the model's own forward pass
(``functional_call``) over the stacked parameters. Contexts are sampled once per step for
all models that would see the same ones alone.

* **Grouping.** Configs equal in every field but those of :data:`STACK_FREE_FIELDS` (seeds,
  data seeds, priors, ``alpha`` and its curriculum, the evaluation and checkpoint periods, the
  warm start's length), on the same device and standing at the same step, form one stack;
  ``noise_std`` may differ too unless ``expected_loss`` (which adds ``sigma^2``), and
  ``router_lr_scale`` where the router is not warm-started. A field added to
  :class:`~fvlib.training.config.TrainConfig` later must be equal. Other configs form other
  stacks, trained in the same loop; nothing is rejected.
* **Contexts.** Each model draws its contexts from its own generator, seeded exactly as in
  ``train`` (``config.effective_data_seed``). Models whose contexts coincide (the same data
  seed and the same prior, ``n_ctx``, ``noise_std``, ``batch``, ``queries``) share one draw:
  that changes no number, it only saves time. For common random numbers give the configs one
  ``data_seed``: ``[dataclasses.replace(c, data_seed=0) for c in configs]``; then the models
  of a stack read the shared contexts once (:func:`fvlib.routers.measure`), which is where
  batching pays most. Training one such config alone with ``train`` gives the same numbers.
* **Run directories.** Each model's directory holds exactly what ``train`` writes (config,
  weights, Adam moments and RNG state, history, the checkpoint's manifest) at the same steps,
  each checkpoint one atomic step, and is locked while trained (:mod:`fvlib.training.rundir`), so
  :func:`~fvlib.training.checkpoint.load_run` reads it, ``train(config, out_dir=dir)`` resumes
  or reloads it, and ``train_many`` resumes directories that ``train`` started, and the other
  way round.
* **Numbers.** With the same configs the results are bitwise reproducible on the CPU. Against
  training alone, the step-0 evaluation, the sampled contexts and the evaluation sets are
  bitwise the same; the batched forward and backward passes add up the same products in
  another order, so weights and losses then agree to float rounding that training carries
  along (tested: final losses within a relative ``1e-4``), not bitwise. A model's numbers can
  likewise differ at that level between stacks of different sizes.
* **Evaluations.** The step-0 evaluation of each model is the one ``train`` does, model by
  model (bitwise the same). The later ones are batched: the models of a stack that are due
  at the same step and share an evaluation set (the same prior, ``n_ctx``, ``noise_std``,
  ``eval_contexts`` and data seed) run it as one ``vmap`` of ``predict_theta`` over their
  stacked parameters, reading each context once; the numbers agree with evaluating each
  model alone to float rounding (tested). Models of :mod:`fvlib.transformer` are evaluated
  model by model.
* **Cost.** Checkpoints are the ones ``train`` writes, model by model.
  ``TrainResult.seconds`` of each model is the wall time of the whole loop: do not sum them.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from .._checks import check_int
from ..models import FVTransformer
from ..routers import training_progress
from .config import TrainConfig, lr_at, resolve_device, training_prior
from .evaluate import eval_set_key, eval_summary, theta_losses
from .loop import (
    TrainingInterrupted,
    TrainingRun,
    TrainResult,
    batch_inputs,
    expected_query_loss,
    interrupt_between_steps,
    progress_shown,
    query_loss,
    readers,
    sample_training_batch,
    set_learning_rate,
)

__all__ = ["train_many", "STACK_FREE_FIELDS"]


#: The config fields that may differ between the runs of one stack (each run draws its own
#: contexts and keeps its own evaluation and checkpoints); every other field, including any
#: field added later, must be equal.
STACK_FREE_FIELDS = frozenset({"seed", "data_seed", "prior", "alpha", "alpha_start", "alpha_ramp", "eval_every",
                               "eval_contexts", "checkpoint_every", "router_warm_start", "device"})


def stack_key(config: TrainConfig) -> tuple:
    """What configs must share to be trained in one stack (besides their current step): every
    field but :data:`STACK_FREE_FIELDS`, the resolved device and the architecture; ``noise_std``
    only with the expected loss (which adds ``sigma^2``), ``router_lr_scale`` only where the
    router is warm-started (the parameter groups' learning rates)."""
    free = set(STACK_FREE_FIELDS)
    if not config.expected_loss:
        free.add("noise_std")
    if not config.warm_starts:
        free.add("router_lr_scale")
    shared = tuple(sorted((k, v) for k, v in config.to_dict().items() if k not in free))
    return (config.model_config(), str(resolve_device(config.device)), shared)


def _data_key(run: TrainingRun) -> tuple:
    """Runs with equal keys draw bitwise the same training contexts from now on."""
    c = run.config
    state = bytes(run.generator.get_state().numpy())
    curriculum = None if c.alpha_start is None else (c.alpha_start, c.alpha_ramp, c.steps, run.step)
    return (c.prior, c.depth, c.alpha, c.noise_std, c.n_ctx, c.batch, c.queries, c.expected_loss, c.input_path,
            curriculum, state)


class _Stream:
    """One sequence of training contexts, drawn once per step for every run that reads it."""

    def __init__(self, run: TrainingRun):
        self.prior, self.config, self.step = run.prior, run.config, run.step
        self.generator = torch.Generator()
        self.generator.set_state(run.generator.get_state())
        self.data: tuple | None = None
        self._moved: dict[str, tuple] = {}

    def draw(self) -> None:
        prior = self.prior if self.config.alpha_start is None else training_prior(self.config, self.step)
        self.step += 1
        batch, x_query, y_query = sample_training_batch(prior, self.config, self.generator)
        if x_query is None:  # expected_loss: the context's own query token and theta instead
            x_query, y_query = batch.x_query, batch.theta
        self.data, self._moved = (*batch_inputs(batch), x_query, y_query), {}

    def on(self, device: torch.device) -> tuple:
        """``(x (B, N, D), y (B, N), x_query (B, Q, D), y_query (B, Q))`` on ``device``; with
        ``expected_loss``, ``(x, y, x_query (B, D), theta (B, D))``; on the pooled statistic
        ``(g (B, D), ...)`` in place of ``x, y``."""
        key = str(device)
        if key not in self._moved:
            self._moved[key] = tuple(t.to(device) for t in self.data)
        return self._moved[key]


class _Reader(torch.nn.Module):
    """``forward`` is one of the wrapped model's readers (for ``functional_call``): its
    prediction or ``theta_hat``, on the tokens or on the pooled statistic
    (:func:`fvlib.training.loop.readers`)."""

    def __init__(self, model, statistic: bool, theta: bool):
        super().__init__()
        self.model, self.statistic, self.theta = model, statistic, theta

    def forward(self, *inputs):
        return readers(self.model, self.statistic)[int(self.theta)](*inputs)


class _Stack:
    """``k`` runs of one architecture whose parameters are stacked along a leading axis ``k``."""

    def __init__(self, runs: list[TrainingRun], streams: list[_Stream], stop: int):
        self.runs, self.streams, self.stop = runs, streams, stop
        self.config = runs[0].config
        self.step = runs[0].step
        self.device = next(runs[0].model.parameters()).device
        self.params, self.buffers = stack_module_state([run.model for run in runs])  # (k, ...) each
        template = copy.deepcopy(runs[0].model).to("meta").train()
        statistic = self.config.statistic
        self.predict_template = _Reader(template, statistic, theta=False)
        self.theta_template = _Reader(copy.deepcopy(template).eval(), statistic, theta=True)
        self.optimizer = torch.optim.Adam(self._parameter_groups(), lr=self.config.lr)
        self._stack_optimizer_state()

    def _parameter_groups(self) -> list[dict]:
        """The stacked parameters in the groups :func:`fvlib.training.loop.parameter_groups` gives one run."""
        by_id = {id(p): name for name, p in self.runs[0].model.named_parameters()}
        return [{"params": [self.params[by_id[id(p)]] for p in group["params"]], "lr_scale": group["lr_scale"]}
                for group in self.runs[0].optimizer.param_groups]

    def _run_params(self, run: TrainingRun) -> dict:
        return dict(run.model.named_parameters())

    def _stack_optimizer_state(self) -> None:
        """Resumed runs bring their Adam moments; stack them like the parameters."""
        for name, stacked in self.params.items():
            states = [run.optimizer.state.get(self._run_params(run)[name]) for run in self.runs]
            if not states[0]:
                assert not any(states), "runs at the same step have the same optimizer state keys"
                continue
            self.optimizer.state[stacked] = {
                key: states[0][key].clone() if key == "step" else torch.stack([s[key] for s in states])
                for key in states[0]
            }

    def _loss(self, params, buffers, *data) -> torch.Tensor:
        """One model's query loss on ``data`` (:meth:`_Stream.on`): :func:`fvlib.training.loop.query_loss`,
        or with ``expected_loss`` :func:`fvlib.training.loop.expected_query_loss`, the last element then
        being ``theta``; vmapped over the stack."""
        state = {f"model.{name}": value for name, value in {**params, **buffers}.items()}
        if self.config.expected_loss:
            theta_of = lambda *inputs: functional_call(self.theta_template, state, inputs)  # noqa: E731
            return expected_query_loss(theta_of, *data, self.config.noise_std)
        predict = lambda *inputs: functional_call(self.predict_template, state, inputs)  # noqa: E731
        return query_loss(predict, *data)

    def _data(self) -> tuple[tuple, int | None]:
        """This step's contexts and their vmap axis: ``None`` when every model reads the same."""
        if all(stream is self.streams[0] for stream in self.streams):
            return self.streams[0].on(self.device), None
        parts = [stream.on(self.device) for stream in self.streams]
        return tuple(torch.stack(tensors) for tensors in zip(*parts)), 0

    def train_step(self) -> list[float]:
        """One Adam step of every model at ``lr_at(step)``; returns the ``k`` losses."""
        set_learning_rate(self.optimizer, lr_at(self.step, self.config))
        data, axis = self._data()
        with training_progress(self.buffers.items(), self.step / self.config.steps):
            losses = vmap(self._loss, in_dims=(0, 0) + (axis,) * len(data))(self.params, self.buffers, *data)  # (k,)
            self.optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()  # each model's gradient is that of its own loss
        self.optimizer.step()
        self.step += 1
        return losses.tolist()

    def _theta(self, params, buffers, *inputs) -> torch.Tensor:
        """One model's ``theta_hat (B, D)`` (``predict_theta``, or on the statistic
        ``predict_theta_statistic``); vmapped over the stack."""
        state = {f"model.{name}": value for name, value in {**params, **buffers}.items()}
        return functional_call(self.theta_template, state, inputs)

    @torch.no_grad()
    def evaluate(self, members: list[int]) -> dict[int, dict]:
        """The evaluations of the models ``members`` at this step, batched per evaluation set:
        ``{i: dict as evaluate_batches returns}``; empty for models that are not
        :class:`~fvlib.models.FVTransformer` (they are evaluated alone)."""
        if not isinstance(self.runs[0].model, FVTransformer):
            return {}
        groups: dict[int, list[int]] = {}
        for i in members:  # runs on the same evaluation contexts hold the same list
            groups.setdefault(id(self.runs[i].eval_batches), []).append(i)
        out = {}
        for group in groups.values():
            index = torch.tensor(group, device=self.device)
            params = {name: value.detach()[index] for name, value in self.params.items()}
            buffers = {name: value[index] for name, value in self.buffers.items()}
            excess, query = [], []
            for batch in self.runs[group[0]].eval_batches:
                batch = batch.to(self.device)
                inputs = (*batch_inputs(batch), batch.x_query)
                theta_hat = vmap(self._theta, in_dims=(0, 0) + (None,) * len(inputs))(
                    params, buffers, *inputs)  # (k, B, D)
                stack_excess, stack_query = theta_losses(theta_hat, batch)  # (k, B) each
                excess.append(stack_excess)
                query.append(stack_query)
            excess_all, query_all = torch.cat(excess, dim=1), torch.cat(query, dim=1)
            for j, i in enumerate(group):
                out[i] = eval_summary(excess_all[j], query_all[j])
        return out

    @torch.no_grad()
    def sync(self, i: int) -> None:
        """Write model ``i``'s weights, Adam moments and RNG state back into its run."""
        run = self.runs[i]
        for name, param in self._run_params(run).items():
            stacked = self.params[name]
            param.copy_(stacked[i])
            state = self.optimizer.state.get(stacked)
            if state:
                run.optimizer.state[param] = {
                    key: value.clone() if key == "step" else value[i].clone() for key, value in state.items()
                }
        run.generator.set_state(self.streams[i].generator.get_state())


def _check_args(configs, out_dirs, until_step) -> tuple[list[TrainConfig], list[Path | None], list[int]]:
    if isinstance(configs, (str, bytes)) or not isinstance(configs, Sequence) or not configs:
        raise ValueError(f"configs must be a non-empty list of TrainConfig, got {configs!r}")
    for i, config in enumerate(configs):
        if not isinstance(config, TrainConfig):
            raise ValueError(f"configs[{i}] must be a TrainConfig, got {type(config).__name__}")
    if out_dirs is None:
        out_dirs = [None] * len(configs)
    if isinstance(out_dirs, (str, bytes, os.PathLike)) or not isinstance(out_dirs, Sequence):
        raise ValueError(f"out_dirs must be None or a list of directories (one per config), got {out_dirs!r}")
    if len(out_dirs) != len(configs):
        raise ValueError(f"out_dirs holds {len(out_dirs)} directories for {len(configs)} configs")
    dirs = [None if d is None else Path(d) for d in out_dirs]
    seen: dict[Path, int] = {}
    for i, d in enumerate(dirs):
        if d is not None:
            if d.resolve() in seen:
                raise ValueError(f"out_dirs[{seen[d.resolve()]}] and out_dirs[{i}] are the same directory {str(d)!r}")
            seen[d.resolve()] = i
    stops = [c.steps if until_step is None else check_int("until_step", until_step, 1, c.steps) for c in configs]
    return list(configs), dirs, stops


def make_stacks(runs: list[TrainingRun], stops: list[int]) -> list[_Stack]:
    """Stack the runs that still have steps to go; runs with the same contexts share a stream."""
    streams: dict[tuple, _Stream] = {}
    groups: dict[tuple, list[int]] = {}
    for i, (run, stop) in enumerate(zip(runs, stops)):
        if run.step < stop:
            groups.setdefault((stack_key(run.config), run.step, stop), []).append(i)
    stacks = []
    for (_, _, stop), members in groups.items():
        member_streams = [streams.setdefault(_data_key(runs[i]), _Stream(runs[i])) for i in members]
        stacks.append(_Stack([runs[i] for i in members], member_streams, stop))
    return stacks


def _after_step(stack: _Stack, losses: list[float]) -> None:
    """Every model's bookkeeping after a step, as in :func:`fvlib.training.loop.train` (the
    evaluations due batched, :meth:`_Stack.evaluate`)."""
    for run, loss in zip(stack.runs, losses):
        run.count_step(loss)
    due = [i for i, run in enumerate(stack.runs) if run.eval_due()]
    results = stack.evaluate(due) if due else {}
    for i, run in enumerate(stack.runs):
        evaluate, checkpoint = i in due, run.checkpoint_due(stack.stop)
        if checkpoint or (evaluate and i not in results):
            stack.sync(i)
        if evaluate:
            run.record_eval(results.get(i))
        if checkpoint:
            run.checkpoint()


def train_many(
    configs: Sequence[TrainConfig],
    out_dirs: Sequence[str | os.PathLike | None] | None = None,
    *,
    resume: bool = True,
    progress: bool = True,
    until_step: int | None = None,
    threads: int | None = None,
) -> list[TrainResult]:
    """Train every config as :func:`fvlib.training.loop.train` would, batched (see the module docs).

    Args:
        configs: the runs (any mix; those that can be stacked are).
        out_dirs: one directory per config (``None`` entries stay in memory), e.g.
            ``[run_dir_for(c) for c in configs]``; ``None`` keeps every run in memory.
        resume: continue each run from the checkpoint in its directory, as ``train`` does;
            finished runs are loaded, not retrained.
        progress: one tqdm bar for all the models (model steps done out of those to do).
        until_step: stop every run after this step (with a checkpoint), as in ``train``;
            calling again resumes. Must lie in ``[1, steps]`` for every config.
        threads: torch CPU threads while training (``torch.set_num_threads``; restored after);
            ``None`` keeps the current setting. The stacked steps are large enough that two
            threads help on an otherwise idle 2-core machine; results are deterministic for a
            given thread count (another count can change the last bits).

    Returns:
        One :class:`~fvlib.training.loop.TrainResult` per config, in order; each ``model`` is on its
        training device in eval mode, and ``seconds`` is the wall time of the whole loop.

    Raises:
        ValueError: configs that are not ``TrainConfig``, ``out_dirs`` of another length or
            naming one directory twice, ``until_step`` out of range, the
            :class:`~fvlib.training.rundir.RunDirError` of a directory ``train`` would refuse, and
            :class:`~fvlib.training.loop.TrainingDiverged` when a run diverges (every directory keeps
            its last checkpoint).
    """
    configs, dirs, stops = _check_args(configs, out_dirs, until_step)
    if threads is not None:
        check_int("threads", threads, 1)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return train_many(configs, dirs, resume=resume, progress=progress, until_step=until_step)
        finally:
            torch.set_num_threads(before)
    eval_sets: dict[tuple, list] = {}  # runs on the same evaluation contexts share them
    runs: list[TrainingRun] = []
    try:
        for config, out_dir in zip(configs, dirs):
            run = TrainingRun(config, out_dir, resume, eval_sets.get(eval_set_key(config)))
            eval_sets.setdefault(eval_set_key(config), run.eval_batches)
            runs.append(run)
        _train_runs(runs, stops, progress)
    finally:
        for run in runs:  # their directories' locks
            run.close()
    return [run.result() for run in runs]


def _train_runs(runs: list[TrainingRun], stops: list[int], progress: bool) -> None:
    """The loop of :func:`train_many`: every run up to its stop, stacked where possible."""
    for run in runs:
        if not run.history:
            run.record_eval()
    stacks = make_stacks(runs, stops)
    total = sum((stack.stop - stack.step) * len(stack.runs) for stack in stacks)
    bar = tqdm(total=total, disable=not progress_shown(progress), leave=False, desc=f"{len(runs)} models")
    active = stacks
    try:
        with interrupt_between_steps() as interrupted:
            while active:
                for stream in {id(s): s for stack in active for s in stack.streams}.values():
                    stream.draw()
                for stack in active:
                    _after_step(stack, stack.train_step())
                    bar.update(len(stack.runs))
                active = [stack for stack in active if stack.step < stack.stop]
                if interrupted() and active:
                    _checkpoint_and_stop(active)
    finally:
        bar.close()


def _checkpoint_and_stop(active: list[_Stack]) -> None:
    """Ctrl-C: checkpoint every run of the ``active`` stacks at its current step, then raise
    :class:`~fvlib.training.loop.TrainingInterrupted`."""
    saved = []
    for stack in active:
        for i, run in enumerate(stack.runs):
            if run.out_dir is None:
                continue
            if run.saved_step != run.step:
                stack.sync(i)
                run.checkpoint()
            saved.append(run.out_dir)
    steps = sorted({stack.step for stack in active})
    where = (saved[0] if len(saved) == 1 else f"each of its {len(saved)} run directories") if saved else None
    raise TrainingInterrupted(where, steps[0] if len(steps) == 1 else f"{steps[0]} to {steps[-1]}")
