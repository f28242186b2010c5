"""Regenerate the book's headline results as JSON files (``python -m fvlib reproduce``).

Full mode uses the book's reference configuration (chapter 6, *Tree prior*, section "The
reference configuration": tree K = 6, alpha = 0.5, N = 128, M = 6, 3000 training steps);
``quick`` mode a small one (K = 3, M = 3, 150 steps) that runs in about a minute on a laptop
and is what the tests exercise. Both train with the :class:`~fvlib.training.config.TrainConfig` defaults
(:data:`fvlib.training.config.RECIPE`: no teacher). Files written to ``out_dir``:

* ``theory.json`` -- :func:`~fvlib.theory.baselines.theory_baselines` (with optimised directions);
* ``dp.json`` -- DP and greedy values on a K = 3 tree (tau = 0.3 and 0.6);
* ``models.json`` -- models A, B, C on the tree and its Gaussian twin, each beside its theory;
* ``patching.json`` -- the key-patching heatmap of model A beside the greedy policy's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..files import write_json_atomic
from ..interventions import key_patching_sweep
from ..priors import TreePrior
from ..theory import dp_value, greedy_value, theory_baselines, theory_patching_sweep
from ..training import TrainConfig, run_dir_for, train
from .beside_theory import compare_with_theory

__all__ = ["ReproduceConfig", "reproduce"]


@dataclass(frozen=True)
class ReproduceConfig:
    depth: int
    alpha: float
    n_ctx: int
    budget: int
    steps: int
    samples: int
    contexts: int
    dp_layers: tuple[int, ...]

    @classmethod
    def make(cls, quick: bool) -> ReproduceConfig:
        if quick:
            return cls(depth=3, alpha=0.5, n_ctx=64, budget=3, steps=150, samples=500, contexts=200, dp_layers=(2,))
        return cls(depth=6, alpha=0.5, n_ctx=128, budget=6, steps=3000, samples=4000, contexts=2000, dp_layers=(2, 3))


def _write(out_dir: Path, name: str, data: dict) -> str:
    path = out_dir / name
    write_json_atomic(path, data, indent=2)
    return str(path)


def reproduce(out_dir, quick: bool = False, seed: int = 0, progress: bool = True) -> dict:
    """Recompute every result file; returns ``{name: path}``. Training runs are kept (and
    resumed) under ``out_dir/runs``."""
    cfg = ReproduceConfig.make(quick)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tree = TreePrior(cfg.depth, cfg.alpha)
    written = {}
    theory = theory_baselines(tree, cfg.n_ctx, 0.0, cfg.budget, samples=cfg.samples, seed=seed, optimised=True)
    written["theory"] = _write(out_dir, "theory.json", theory)

    small = TreePrior(3, 0.5)
    dp = {f"L{layers}_tau{tau}": {"dp": dp_value(small, layers, tau), "greedy": greedy_value(small, layers, tau)}
          for layers in cfg.dp_layers for tau in (0.3, 0.6)}
    written["dp"] = _write(out_dir, "dp.json", dp)

    models, runs = {}, {}
    for prior in ("tree", "gaussian-twin"):
        for kind in ("A", "B", "C"):
            config = TrainConfig(model=kind, prior=prior, depth=cfg.depth, alpha=cfg.alpha, n_ctx=cfg.n_ctx,
                                 budget=cfg.budget, steps=cfg.steps, seed=seed, eval_every=max(cfg.steps // 10, 1))
            result = train(config, out_dir=run_dir_for(config, out_dir / "runs"), progress=progress)
            runs[(kind, prior)] = result
            comparison = compare_with_theory(result.model, config, contexts=cfg.contexts, seed=seed)
            models[f"{kind}/{prior}"] = {**comparison, "seconds": result.seconds, "checkpoint": str(result.checkpoint)}
    written["models"] = _write(out_dir, "models.json", models)

    model_a = runs[("A", "tree")].model
    kw = dict(contexts=cfg.contexts, seed=seed)
    sweep = key_patching_sweep(model_a, tree, cfg.n_ctx, 0.0, **kw)
    theory_sweep = theory_patching_sweep(tree, cfg.n_ctx, 0.0, model_a.config.n_layers, **kw)
    patching = {"model": sweep.to_dict(), "theory": theory_sweep.to_dict(),
                "split_levels": sweep.split_levels, "layers": sweep.layers}
    written["patching"] = _write(out_dir, "patching.json", patching)
    return written
