"""Batched training against training one model after another (chapter 8, *Experiments*).

Not a test: run it by hand and read the numbers.

    python benchmarks/bench_sweep.py                  # shared contexts, 100 steps, 2 threads
    python benchmarks/bench_sweep.py --mode both --threads 1

Trains 8 models of the reference configuration (tree K=6, alpha=0.5, N=128, M=6, model A,
batch 256) with the book's original recipe (``fvlib.training.ORIGINAL_RECIPE``: lr 3e-3, 64
query tokens, so that the numbers compare with earlier measurements) for ``--steps`` steps (default
100, so that the benchmark takes a few minutes on 2 CPU cores), seeds 0..7, in one or two modes:

* per-model contexts: ``data_seed=None``, each model draws its own contexts, as ``train``;
* shared contexts: ``data_seed=0``, all 8 models see the same contexts (common random numbers,
  as the book's seed sweeps use them; the default mode).

Each mode times ``train`` on the 8 configs one after another and ``train_many`` on all of
them (both in memory, evaluations at step 0 and at the end on 2048 contexts included), and
compares the final excess losses. With per-model contexts each model still samples its own
contexts (about a tenth of a step alone) and the stacked models read 8 different context
sets; with shared contexts they are drawn once and read once (:func:`fvlib.routers.measure`).
The evaluations (2048 contexts per model at step 0 and at the end) run model by model
under ``train``; under ``train_many`` the step-0 ones too, the final ones batched over the
stack (one pass over the shared evaluation contexts), so short runs (small ``--steps``) weigh
the step-0 evaluations more.
The two last lines give the speedup of the last mode run (the shared one under ``both``)
and the largest relative difference of final losses over every model of the modes run:

    batched speedup: X.XX (8 models)
    max relative difference: X.Xe-XX
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from fvlib.training import ORIGINAL_RECIPE, TrainConfig, train
from fvlib.training.batched import train_many

MODELS = 8
MODES = {"per-model": None, "shared": 0}  # mode -> data_seed


def configs(steps: int, data_seed: int | None) -> list[TrainConfig]:
    base = TrainConfig(steps=steps, device="cpu", data_seed=data_seed, **ORIGINAL_RECIPE)
    return [dataclasses.replace(base, seed=seed) for seed in range(MODELS)]


def timed(fn):
    """``(result, wall seconds, process CPU seconds)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def compare(steps: int, data_seed: int | None) -> tuple[float, float]:
    """Speedup (alone wall time / batched wall time) and the largest relative difference of
    the final losses; prints the details."""
    cfgs = configs(steps, data_seed)
    alone, alone_wall, alone_cpu = timed(lambda: [train(c, progress=False) for c in cfgs])
    batched, batched_wall, batched_cpu = timed(lambda: train_many(cfgs, progress=False))
    diffs = [abs(b.final_loss - a.final_loss) / a.final_loss for a, b in zip(alone, batched)]
    losses = ", ".join(f"{a.final_loss:.4f}" for a in alone)
    print(f"  one after another: {alone_wall:6.1f} s wall, {alone_cpu:6.1f} s CPU")
    print(f"  train_many       : {batched_wall:6.1f} s wall, {batched_cpu:6.1f} s CPU")
    print(f"  speedup {alone_wall / batched_wall:.2f}; final losses (alone) {losses}; max rel. diff {max(diffs):.1e}")
    return alone_wall / batched_wall, max(diffs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="training steps per model (default 100)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2, as in CI)")
    parser.add_argument("--mode", choices=["both", *MODES], default="shared", help="which contexts (default shared)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{MODELS} models of model A, {args.steps} steps")
    results = {}
    for mode, data_seed in MODES.items():
        if args.mode in ("both", mode):
            print(f"{mode} contexts (data_seed={data_seed}):")
            results[mode] = compare(args.steps, data_seed)
    mode = "shared" if "shared" in results else "per-model"
    print(f"speedup reported for {mode} contexts")
    print(f"batched speedup: {results[mode][0]:.2f} ({MODELS} models)")
    print(f"max relative difference: {max(diff for _, diff in results.values()):.1e}")


if __name__ == "__main__":
    main()
