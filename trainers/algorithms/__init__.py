"""RL algorithm math: turn rewards, advantages, losses, information gain and the registry.

    rewards            per-turn rewards (information gain, format penalty, outcome)
    advantages         group normalisation, IG-Scale, discounting, token broadcast
    losses             clipped surrogate, k3 KL, TIS, entropy (pure tensor functions)
    information_gain   probe scores in one packed forward, fused with the old log-probs
    probes             the pseudo-response appended at each turn boundary
    packed_attention   the attention pattern of that packed forward
    registry           the Algorithm interface, registration and the placebo wrapper
    builtin            IGPO, GRPO and RLOO

The registry's public names are importable from here, so a plug-in algorithm is written
against `trainers.algorithms` (docs/algorithms.md).
"""

from trainers.algorithms.builtin import GRPO, IGPO, RLOO, IGPOConfig  # registers them
from trainers.algorithms.registry import (
    Advantages,
    Algorithm,
    Placebo,
    PolicyGradientConfig,
    algorithm_class,
    available_algorithms,
    make_algorithm,
    placebo_signs,
    register_algorithm,
)

__all__ = ["GRPO", "IGPO", "RLOO", "Advantages", "Algorithm", "IGPOConfig", "Placebo",
           "PolicyGradientConfig", "algorithm_class", "available_algorithms", "make_algorithm",
           "placebo_signs", "register_algorithm"]
