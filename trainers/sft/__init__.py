"""Masked SFT (DR-Venus stage 1): config, packing, trainer, Ray data parallelism.

Import the modules directly: `trainers.sft.config`, `.packing`, `.varlen`, `.trainer`,
`.distributed`, `.pipeline` (docs/sft.md). This package imports nothing itself, so
importing one module does not pull in Ray or the environment.
"""
