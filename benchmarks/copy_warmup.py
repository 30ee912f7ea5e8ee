"""How fast the induction warm-up teaches a tiny model to copy, at two batch sizes.

    .venv/bin/python benchmarks/copy_warmup.py                  # ~5 min on 2 cores
    .venv/bin/python benchmarks/copy_warmup.py --steps 600 --batch-sizes 16 64
    python benchmarks/copy_warmup.py --device cuda --vocab 1024 --hidden 256 --layers 6 \
        --lr 1e-3 --steps 4000 --batch-sizes 64      # sft_gpu.yaml's model

Trains the same seeded tiny Qwen3 (the SFT example's shape by default) on the shuffled-chunk
copy task (trainers/sft/warmup.py) once per batch size, and prints the copy loss every 100
steps and the first step whose loss is below `--solved` nats. Chance is log(vocab). The
finding it reproduces (docs/benchmarks.md): the copy phase change depends on the batch size
far more than on the learning rate or the number of steps.

Prints `RESULT steps_to_copy_bs<B>=<step or -1>` per batch size and last
`RESULT copy_loss_ratio=<final loss at the smallest batch / at the largest>`.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from trainers.modeling.models import build_tiny_causal_lm
from trainers.sft.warmup import copy_task_batch, copy_task_loss


class _VocabOnly:
    """Just enough of a tokenizer for build_tiny_causal_lm: a length and three ids."""

    def __init__(self, size: int):
        self.size, self.eos_token_id, self.pad_token_id, self.bos_token_id = size, 1, 0, None

    def __len__(self) -> int:
        return self.size


def train_copy(vocab: int, batch_size: int, steps: int, args: argparse.Namespace
               ) -> tuple[list[float], int]:
    model = build_tiny_causal_lm(_VocabOnly(vocab), hidden=args.hidden, layers=args.layers,
                                 heads=args.heads, intermediate=4 * args.hidden,
                                 seed=args.seed).train().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.01)
    generator = torch.Generator().manual_seed(args.seed)
    curve, solved_at = [], -1
    for step in range(1, steps + 1):
        ids, targets = copy_task_batch(vocab, batch_size, 32, chunk=4, generator=generator,
                                       low_id=10)
        loss = copy_task_loss(model, ids.to(args.device), targets.to(args.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if solved_at < 0 and loss.item() < args.solved:
            solved_at = step
        if step % 100 == 0:
            curve.append(round(loss.item(), 3))
    return curve, solved_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--solved", type=float, default=1.0,
                        help="copy loss (nats) counted as solved")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu",
                        help="e.g. cuda (one H100 ran hidden 256 x 6 layers at ~30 steps/s "
                             "with four runs sharing it)")
    args = parser.parse_args()
    print(f"vocab {args.vocab} (chance {math.log(args.vocab - 10):.2f} nats), hidden "
          f"{args.hidden}, layers {args.layers}, heads {args.heads}, lr {args.lr}, "
          f"{args.steps} steps", flush=True)
    finals = {}
    for batch_size in args.batch_sizes:
        started = time.perf_counter()
        curve, solved_at = train_copy(args.vocab, batch_size, args.steps, args)
        finals[batch_size] = curve[-1] if curve else float("nan")
        print(f"batch {batch_size}: copy loss every 100 steps {curve} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
        print(f"RESULT steps_to_copy_bs{batch_size}={solved_at}", flush=True)
    smallest, largest = min(finals), max(finals)
    print(f"RESULT copy_loss_ratio={finals[smallest] / finals[largest]:.3f}")


if __name__ == "__main__":
    main()
