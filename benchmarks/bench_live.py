"""Benchmark of the explorers' live grids: what they add to the book's build (prints figures;
not a test).

    python benchmarks/bench_live.py

For each explorer at the settings of its chapter, prints the number of states of the grid that
its HTML view embeds in the static page (:mod:`fvlib.explorers.live`), the wall and CPU seconds to
compute them (one thread) and the size of the embedded JSON. The training and patching grids
use the chapters' shared runs in book/.fvlib_runs (trained if missing, which takes minutes).
"""

import json
import os
import time
from pathlib import Path

import torch

from fvlib import TreePrior
from fvlib.explorers.live import grid_states
from fvlib.explorers.patching import patching_explorer
from fvlib.explorers.prior import prior_explorer
from fvlib.explorers.strategy import strategy_explorer
from fvlib.explorers.training import training_explorer


def measure(name: str, explorer) -> None:
    spec = explorer.live_spec()
    wall, cpu = time.perf_counter(), time.process_time()
    data = grid_states(spec)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    size = len(json.dumps(data, separators=(",", ":")))
    print(f"{name:9s} {len(data['states']):4d} states  {wall:6.1f} s wall  {cpu:6.1f} s CPU  {size / 1e3:6.0f} kB",
          flush=True)


def main():
    torch.set_num_threads(1)
    os.chdir(Path(__file__).resolve().parents[1] / "book")  # the chapters' run directory
    from fvlib.experiments.inbuild import shared_configs
    from fvlib.interventions import key_patching_sweep
    from fvlib.theory import theory_patching_sweep
    from fvlib.training import run_dir_for, train

    measure("prior", prior_explorer(depth=4, alpha=0.5, seed=0))                      # chapter 2
    measure("strategy", strategy_explorer(depth=6, budget=6, alpha=0.5, n_ctx=128,    # chapter 6
                                          noise_std=0.0, samples=1000, seed=0))
    measure("training", training_explorer(base=shared_configs()[("A", "tree")]))      # chapter 8
    config = shared_configs(device="auto")[("A", "tree")]                             # chapter 10
    model = train(config, out_dir=run_dir_for(config), progress=False).model
    tree = TreePrior(5, 0.5)
    sweep = key_patching_sweep(model, tree, 128, 0.0, contexts=2000, seed=0)
    theory = theory_patching_sweep(tree, 128, 0.0, n_layers=5, contexts=2000, seed=0)
    measure("patching", patching_explorer(tree, model=model, sweep=sweep, theory_sweep=theory, n_ctx=128,
                                          noise_std=0.0, split_level=1, layer=3, contexts=2000, seed=0))


if __name__ == "__main__":
    main()
