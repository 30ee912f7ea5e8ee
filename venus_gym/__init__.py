"""venus-gym: the environment-independent core for small deep-research agents.

The turn protocol (`venus_gym.protocol`), answer scoring (`venus_gym.scoring`), the corpus
and tools (`venus_gym.corpus`, `venus_gym.tools`) and the worlds (`venus_gym.worlds`).
This package imports neither `envs` (the Gymnasium environments, which register
themselves on `import envs`) nor `trainers`; tests/test_layering.py checks it.
"""

__version__ = "0.1.0"
