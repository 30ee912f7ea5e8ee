"""IGPO vs GRPO from one SFT checkpoint, several seeds each (trainers.rl.compare).

    python examples/compare_igpo_grpo.py --sft-model runs/demo/sft/final \
        --config examples/configs/compare_rl.yaml --seeds 0 1 2

Needs the package installed (`pip install -e .[train]`, as `make test` and `make demo` do).
"""

import sys

from trainers.rl.compare import main

if __name__ == "__main__":
    sys.exit(main(default_config="examples/configs/compare_rl.yaml"))
