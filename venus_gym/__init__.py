"""venus-gym: environments and trainers for small deep-research agents.

Importing the package registers the Gymnasium ids in `venus_gym.registration.ENV_SPECS`
(DeepResearch-v0, DeepResearch-HotpotQA-v0).
"""

from venus_gym.registration import register_envs

__version__ = "0.1.0"

register_envs()
