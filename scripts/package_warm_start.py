"""python scripts/package_warm_start.py --from runs/sft_compact_third/final

Packages an SFT policy as venus-gym's `warm-start` (trainers/warm_start/): copies it,
evaluates it on held-out tasks of worlds its SFT never saw and writes the model card
(trainers.modeling.warm_start has the details and the options).
"""

import sys

from trainers.sft.warm_start_package import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
