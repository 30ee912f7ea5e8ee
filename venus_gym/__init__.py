"""venus-gym: the environment-independent core for small deep-research agents.

The turn protocol (`venus_gym.protocol`), answer scoring (`venus_gym.scoring`), the corpus
and tools (`venus_gym.corpus`, `venus_gym.tools`) and the worlds (`venus_gym.worlds`).

Importing it registers the Gymnasium ids (DeepResearch-v0, DeepResearch-HotpotQA-v0) as data
(`venus_gym.registration`): their entry points are strings that Gymnasium imports on the first
`gym.make`, so this package still imports neither `envs` (the environments) nor `trainers`;
tests/test_layering.py checks it.

    import gymnasium as gym, venus_gym
    env = gym.make("DeepResearch-v0")
"""

from venus_gym.registration import register_envs

__version__ = "0.1.0"

register_envs()
