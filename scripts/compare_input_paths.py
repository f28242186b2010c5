"""Model A trained on the tokens and on the pooled statistic at one configuration, three seeds
each: do the two paths give the same final loss, within the seeds' spread?

    python scripts/compare_input_paths.py [--steps 3000] [--device cuda] [--json out.json]

Tree K = 5, alpha = 0.6, N = 96, sigma = 0.1, M = 5 (a configuration the book does not train),
``LEARNING_RECIPE`` with its curriculum (``recipe_for``), seeds 0, 1, 2, each seed its own data
(``data_seed = None``), the seeds of a path stacked in one ``train_many`` call. The paths agree
when ``|mean_tokens - mean_statistic| <= 2 sqrt(s_tokens^2 / 3 + s_statistic^2 / 3)``, ``s`` the
standard deviation of the final loss over the seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch

from fvlib.training import TrainConfig, recipe_for, train_many

TASK = dict(model="A", prior="tree", depth=5, alpha=0.6, n_ctx=96, noise_std=0.1, budget=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    parser.add_argument("--device", default="cpu", help="cpu (default, one thread), cuda, ...")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {"task": TASK, "steps": args.steps, "device": args.device, "paths": {}}
    for inputs in ("statistic", "tokens"):
        configs = [TrainConfig(**TASK, **recipe_for("constrained", "tree", TASK["alpha"]), steps=args.steps,
                               seed=seed, inputs=inputs, device=args.device) for seed in (0, 1, 2)]
        start = time.perf_counter()
        results = train_many(configs, progress=False)
        losses = [r.final_loss for r in results]
        out["paths"][inputs] = {"final_loss": losses, "mean": float(np.mean(losses)),
                                "std": float(np.std(losses, ddof=1)), "seconds": time.perf_counter() - start}
        print(f"{inputs:9s} final losses {', '.join(f'{v:.4f}' for v in losses)}  mean {np.mean(losses):.4f}  "
              f"sd {np.std(losses, ddof=1):.4f}  ({time.perf_counter() - start:.0f} s for 3 seeds)")
    s, t = out["paths"]["statistic"], out["paths"]["tokens"]
    bound = 2 * math.sqrt(s["std"] ** 2 / 3 + t["std"] ** 2 / 3)
    out["difference"], out["bound"] = abs(s["mean"] - t["mean"]), bound
    out["agree"] = out["difference"] <= bound
    out["speedup"] = t["seconds"] / s["seconds"]
    print(f"|difference of means| {out['difference']:.4f}  bound 2 sqrt(s1^2/3 + s2^2/3) {bound:.4f}  "
          f"agree: {out['agree']}; the statistic path trained {out['speedup']:.1f} times faster")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
