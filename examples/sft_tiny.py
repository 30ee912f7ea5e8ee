"""The SFT recipe as a script: `venus-gym sft` (trainers.sft.recipe) with a default config.

    python examples/sft_tiny.py --config examples/configs/sft_tiny.yaml

Every option of `venus-gym sft --help` applies. Needs the package installed
(`pip install -e .[train]`, as `make test` and `make demo` do).
"""

import sys

from trainers.sft.recipe import main

if __name__ == "__main__":
    sys.exit(main(default_config="examples/configs/sft_tiny.yaml"))
