"""Suite-wide settings.

Tiny models on a shared 2-core machine run several times faster single-threaded (thread
hand-off dominates their matmuls), and one thread keeps CPU results reproducible.
"""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:
    import torch
except ImportError:  # the environment tests need no torch
    torch = None

if torch is not None:
    torch.set_num_threads(1)
