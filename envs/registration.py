"""Environment ids this package registers with Gymnasium (registration is data).

The specs live in venus_gym.registration, so `import venus_gym` registers them too (lazily:
the entry points are strings naming this package's classes). `import envs` registers them as
well, and `gym.make("envs:DeepResearch-v0")` imports this package for you.
"""

from venus_gym.registration import ENV_SPECS, register_envs

__all__ = ["ENV_SPECS", "register_envs"]
