"""Model A with each router against model B at one configuration, with the one recipe.

Trains ``A``, ``A-bilinear``, ``A-coord`` and ``B`` (:data:`fvlib.experiments.CONTROL_VARIANTS`,
:func:`fvlib.experiments.controls_config`) at the given task, ``--seeds`` seeds each (stacked in
:func:`fvlib.training.batched.train_many`), ``--steps`` steps, no doubling, and prints each
variant's mean over seeds with its standard error (seed spread and Monte Carlo,
:func:`fvlib.stats.seed_mean_stderr`) and its ratio to B with the delta-method standard error.

    python scripts/compare_routers.py --depth 5 --alpha 0.6 --n-ctx 96 --noise-std 0.1 --budget 5
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from fvlib.experiments import controls_config
from fvlib.stats import independent_ratio, seed_mean_stderr
from fvlib.training import train_many

VARIANTS = ("A", "A-bilinear", "A-coord", "B")


def compare(task: dict, seeds: int, steps: int, variants=VARIANTS) -> dict:
    """``{variant: {"loss": [per seed], "mean", "stderr", "ratio_to_B": (ratio, se)}}``."""
    configs = [replace(controls_config(v, steps=steps, **task), seed=s) for v in variants for s in range(seeds)]
    results = train_many(configs, None, progress=False, threads=1)
    out = {}
    for i, v in enumerate(variants):
        runs = results[i * seeds:(i + 1) * seeds]
        loss = [r.final_loss for r in runs]
        mc = [r.history[-1]["eval_stderr"] for r in runs]
        out[v] = {"loss": loss, "mean": sum(loss) / seeds, "stderr": seed_mean_stderr(loss, mc)}
    for v in variants:
        if v != "B":
            out[v]["ratio_to_B"] = independent_ratio((out[v]["mean"], out[v]["stderr"]),
                                                     (out["B"]["mean"], out["B"]["stderr"]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prior", default="tree")
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--n-ctx", type=int, default=96)
    p.add_argument("--noise-std", type=float, default=0.1)
    p.add_argument("--budget", type=int, default=5)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    task = dict(prior=a.prior, depth=a.depth, alpha=a.alpha, n_ctx=a.n_ctx, noise_std=a.noise_std, budget=a.budget)
    out = compare(task, a.seeds, a.steps)
    if a.json:
        print(json.dumps({"task": task, "seeds": a.seeds, "steps": a.steps, "variants": out}, indent=1))
        return
    print(f"{task}, {a.seeds} seeds, {a.steps} steps")
    for v, row in out.items():
        ratio = row.get("ratio_to_B")
        text = f"{ratio[0]:.3f} +- {ratio[1]:.3f}" if ratio else "1"
        seeds = ", ".join(f"{x:.5f}" for x in row["loss"])
        print(f"{v:12s} loss {row['mean']:.5f} +- {row['stderr']:.5f}  (seeds {seeds})  / B {text}")


if __name__ == "__main__":
    main()
