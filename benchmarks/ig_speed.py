"""Information-gain speed: reference (one forward per boundary) vs fast (one packed forward).

Both run in the same process on the same random model and trajectory; the script checks
that they agree and prints one `RESULT ig_speedup_T<K>=<float>` line per boundary count,
`T128` last. Defaults reproduce docs/benchmarks.md on CPU (the calibration setup of docs/benchmarks.md:
hidden-128 2-layer Qwen3, 12-token probe, 4,096-token trajectory):

    .venv/bin/python benchmarks/ig_speed.py
    .venv/bin/python benchmarks/ig_speed.py --probe-tokens 24 --answer-tokens 4   # Qwen-sized probe

    --preset tiny  hidden-128, 2-layer Qwen3, vocab 1000, fp32 (CPU)
    --preset 1b    Llama-3.2-1B layer shapes as a Qwen3 (1.5B parameters with untied
                   embeddings, random weights, bf16), meant for a GPU:
                   --preset 1b --device cuda --tokens 32768

Timing is interleaved because the shared 2-core dev machine's speed drifts by up to 5x
within seconds (noisy neighbours): the reference's K boundaries are split into up to
--slices strided slices with a fast run before and after each; every slice gives a speedup
estimate (its reference time scaled to K boundaries over the fast runs around it) and the
median estimate is reported. Times printed are medians (fast) and totals (reference). The
fast path is timed without the fused old-log-prob output so both sides compute the same
numbers; the fused cost (old log-probs of all L-1 tokens too) is printed as well.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.ig_reference import reference_probe_scores  # noqa: E402
from trainers.algorithms.information_gain import (  # noqa: E402
    InformationGainConfig,
    fast_probe_scores,
)
from trainers.algorithms.probes import ProbeTemplate  # noqa: E402
from trainers.modeling.models import tiny_causal_lm  # noqa: E402

PRESETS = {
    "tiny": dict(arch="qwen3", vocab_size=1000, hidden_size=128, num_layers=2, num_heads=4,
                 num_kv_heads=2, intermediate_size=256, dtype=torch.float32),
    "1b": dict(arch="qwen3", vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32,
               num_kv_heads=8, intermediate_size=8192, dtype=torch.bfloat16),
}


def synthetic_probe(vocab_size: int, probe_tokens: int, answer_tokens: int, seed: int):
    """A probe of `probe_tokens` random ids with an answer span of `answer_tokens` ids.

    Shaped like the real one with a Qwen tokenizer: 4 header ids, the prefix, the answer,
    then "\\n</answer>" + EOS (3 ids).
    """
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (probe_tokens,), generator=generator).tolist()
    header, suffix = 4, 3
    prefix = probe_tokens - header - answer_tokens - suffix
    if prefix < 1:
        raise ValueError("probe_tokens too small for the answer span")
    template = ProbeTemplate(generation_prompt_ids=tuple(ids[:header]),
                             prefix_ids=tuple(ids[header:header + prefix]),
                             suffix_ids=tuple(ids[probe_tokens - suffix:]))
    return template.probe_for_ids(ids[header + prefix:probe_tokens - suffix], answer="synthetic")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device) -> tuple[float, object]:
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


def interleaved_timing(fast, reference_slice, boundaries: torch.Tensor, slices: int,
                       device: torch.device):
    """Time the reference in strided slices of the boundaries, with a fast run before the
    first slice and after every slice.

    Each slice i gives its own estimate: the reference time scaled to all K boundaries over
    the mean of the two fast runs around it; the speedup is the median estimate, so a burst
    of load from a neighbour skews one estimate, not the result.
    Returns (speedup, total reference s, median fast s, reference scores [K, G], fast result).
    """
    count = len(boundaries)
    slices = min(slices, count)
    fast_times, reference_times = [], []
    reference_scores = None
    seconds, fast_result = timed(fast, device)
    fast_times.append(seconds)
    for i in range(slices):
        part = torch.arange(i, count, slices)  # strided: every slice costs about the same
        seconds, scores = timed(lambda part=part: reference_slice(boundaries[part]), device)
        reference_times.append(seconds * count / len(part))
        if reference_scores is None:
            reference_scores = torch.empty(count, scores.shape[1])
        reference_scores[part] = scores
        seconds, fast_result = timed(fast, device)
        fast_times.append(seconds)
    estimates = [reference_times[i] / ((fast_times[i] + fast_times[i + 1]) / 2)
                 for i in range(slices)]
    total_reference = sum(t * len(range(i, count, slices)) / count
                          for i, t in enumerate(reference_times))
    return (statistics.median(estimates), total_reference, statistics.median(fast_times),
            reference_scores, fast_result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=4096, help="trajectory length L")
    parser.add_argument("--boundaries", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--probe-tokens", type=int, default=12,
                        help="probe length; 12 is the calibration setup of docs/benchmarks.md, a real Qwen "
                             "probe with a short answer is ~24")
    parser.add_argument("--answer-tokens", type=int, default=3)
    parser.add_argument("--slices", type=int, default=16, help="reference slices (see above)")
    parser.add_argument("--backend", default="auto", help="fast path backend (see trainers)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="max |fast - reference| allowed (default 1e-4 in fp32, 0.1 in bf16)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    preset = dict(PRESETS[args.preset])
    if args.tolerance is None:
        args.tolerance = 1e-4 if preset["dtype"] == torch.float32 else 0.1
    with device:  # build the weights where they will run (the 1b preset is 1.2B parameters)
        model = tiny_causal_lm(max_positions=args.tokens + args.probe_tokens + 16, **preset)
    vocab = preset["vocab_size"]
    generator = torch.Generator().manual_seed(0)
    trajectory = torch.randint(0, vocab, (args.tokens,), generator=generator).to(device)
    probe = synthetic_probe(vocab, args.probe_tokens, args.answer_tokens, seed=1)
    config = InformationGainConfig(backend=args.backend)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: preset={args.preset} params={n_params / 1e6:.1f}M device={device} "
          f"threads={torch.get_num_threads()}; trajectory L={args.tokens}, "
          f"probe {args.probe_tokens} tokens (answer {args.answer_tokens}), 1 gold answer")

    # The old-log-prob pass alone: the same code path with no probe (chunked head, so a
    # large vocabulary at 32K tokens does not materialise all logits at once).
    policy_mask = torch.ones(args.tokens, dtype=torch.bool, device=device)
    policy_mask[0] = False
    no_boundaries = torch.zeros(0, dtype=torch.long, device=device)
    plain_seconds = statistics.median(
        timed(lambda: fast_probe_scores(model, trajectory, no_boundaries, [probe], config,
                                        policy_mask), device)[0] for _ in range(3))
    print(f"plain forward over the trajectory (the old-log-prob pass alone): {plain_seconds:.3f} s")
    results = []
    for count in args.boundaries:
        # Boundaries spread evenly over the trajectory, as turn ends would be.
        boundaries = torch.linspace(args.tokens / count, args.tokens, count).round().long().to(device)

        def fast(boundaries=boundaries):
            return fast_probe_scores(model, trajectory, boundaries, [probe], config)

        def fused(boundaries=boundaries, policy_mask=policy_mask):
            return fast_probe_scores(model, trajectory, boundaries, [probe], config, policy_mask)

        def reference_slice(part):
            return reference_probe_scores(model, trajectory, part, [probe])

        fast()  # warm-up (allocator, kernels)
        reference_slice(boundaries[:1])
        speedup, reference_seconds, fast_seconds, reference_scores, fast_scores = (
            interleaved_timing(fast, reference_slice, boundaries, args.slices, device))
        fused_seconds = statistics.median(timed(fused, device)[0] for _ in range(3))
        max_diff = (fast_scores.scores - reference_scores).abs().max().item()
        results.append((count, speedup))
        print(f"T={count:4d}: reference {reference_seconds:8.3f} s  fast {fast_seconds:7.3f} s  "
              f"fast+old-log-probs {fused_seconds:7.3f} s  speedup {speedup:6.1f}x  "
              f"max|diff| {max_diff:.2e}")
        if not max_diff <= args.tolerance:
            raise SystemExit(f"fast and reference IG disagree at T={count}: {max_diff:.3e}")
    for count, speedup in results:
        print(f"RESULT ig_speedup_T{count}={speedup:.2f}")


if __name__ == "__main__":
    main()
