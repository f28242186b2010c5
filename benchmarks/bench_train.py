"""A training step of models A, B, C on the tokens and on the pooled statistic (chapter 8,
*Experiments*; ``TrainConfig.inputs``).

Not a test: run it by hand and read the numbers.

    python benchmarks/bench_train.py                 # K = 6, 8; N = 128, 1024 (and 4096 on the statistic)
    python benchmarks/bench_train.py --quick         # fewer repeats, K = 6 only
    python benchmarks/bench_train.py --device cuda   # the same on a GPU

Every figure is the median wall time of a **whole** step, as ``train`` takes it: drawing the
step's contexts (every token, or each context's statistic by ``fvlib.task.sample_statistic``),
forward, backward and Adam, with the recipe of ``python -m fvlib train`` (``LEARNING_RECIPE``:
batch 512, width 256, the expected loss). ``ratio`` is tokens over statistic. ``GFLOP/s`` is the
step's floating-point work (forward and backward, counted by ``torch.utils.flop_counter``) over
its time, beside the peak of a 1024 x 1024 float32 matrix product measured in the same run on
the same threads: how far from the floor of its arithmetic a step runs.

Targets (issue "Train from the pooled statistic"), on 2 idle cores: at least 3x at K = 6,
N = 128; at least 15x at N = 1024; the statistic step within 10% from N = 128 to N = 4096.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from fvlib.task import make_generator
from fvlib.training import (
    LEARNING_RECIPE,
    TrainConfig,
    build_model,
    build_prior,
    lr_at,
    resolve_device,
    sample_training_batch,
    training_step,
)

BASE = TrainConfig(model="A", prior="tree", depth=6, alpha=0.5, n_ctx=128, noise_std=0.0, budget=6, steps=3000,
                   **LEARNING_RECIPE)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_ms(config: TrainConfig, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of a whole training step (sampling, forward, backward, Adam)."""
    device = resolve_device(config.device)
    prior, model = build_prior(config), build_model(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    generator = make_generator(config.seed)
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        start = time.perf_counter()
        training_step(model, optimizer, *sample_training_batch(prior, config, generator), lr=lr_at(i, config))
        _sync(device)
        if i >= warmup:
            times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def step_flops(config: TrainConfig) -> int:
    """Floating-point operations of one step's forward and backward passes."""
    device = resolve_device(config.device)
    prior, model = build_prior(config), build_model(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    data = sample_training_batch(prior, config, make_generator(config.seed))
    with FlopCounterMode(display=False) as counter:
        training_step(model, optimizer, *data, lr=config.lr)
    return counter.get_total_flops()


def matmul_peak_gflops(device: torch.device, size: int = 1024, repeats: int = 20) -> float:
    """GFLOP/s of a float32 ``size x size`` matrix product on ``device`` (median of ``repeats``)."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as the book's runs)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")
    parser.add_argument("--quick", action="store_true", help="K = 6 only, fewer repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per figure (default 15; 6 with --quick)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    repeats = args.repeats or (6 if args.quick else 15)
    depths = (6,) if args.quick else (6, 8)
    peak = matmul_peak_gflops(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU thread(s)"
    print(f"torch {torch.__version__}, {name}; float32 1024^3 matrix product: {peak:.1f} GFLOP/s (same run)")
    print("whole step (sampling + forward + backward + Adam), LEARNING_RECIPE (batch 512, width 256), median ms")
    print(f"{'model':5s} {'K':>2s} {'N':>5s} {'tokens':>9s} {'statistic':>10s} {'ratio':>6s} "
          f"{'GFLOP/s tokens':>15s} {'GFLOP/s statistic':>18s}")
    for depth in depths:
        for kind in "ABC":
            base = dataclasses.replace(BASE, model=kind, depth=depth, budget=depth, device=args.device)
            stat_times = {}
            for n_ctx in (128, 1024, 4096):
                statistic = dataclasses.replace(base, n_ctx=n_ctx, inputs="statistic")
                stat_ms = stat_times[n_ctx] = step_ms(statistic, repeats)
                stat_gflops = step_flops(statistic) / stat_ms / 1e6
                if n_ctx > 1024:  # the tokens of 512 contexts of 4096 tokens: gigabytes a step
                    print(f"{kind:5s} {depth:2d} {n_ctx:5d} {'-':>9s} {stat_ms:10.1f} {'-':>6s} {'-':>15s} "
                          f"{stat_gflops:18.2f}")
                    continue
                tokens = dataclasses.replace(statistic, inputs="tokens")
                tok_ms = step_ms(tokens, max(3, repeats // 3) if n_ctx > 128 else repeats)
                tok_gflops = step_flops(tokens) / tok_ms / 1e6
                print(f"{kind:5s} {depth:2d} {n_ctx:5d} {tok_ms:9.1f} {stat_ms:10.1f} {tok_ms / stat_ms:6.1f} "
                      f"{tok_gflops:15.2f} {stat_gflops:18.2f}")
            growth = stat_times[4096] / stat_times[128] - 1
            print(f"      statistic step from N = 128 to N = 4096: {100 * growth:+.1f}%")


if __name__ == "__main__":
    main()
