"""The DeepResearch Gymnasium environments.

Importing the package registers the ids in `envs.registration.ENV_SPECS`
(DeepResearch-v0, DeepResearch-HotpotQA-v0), so `import envs` before `gym.make`, or name
the package in the id: `gym.make("envs:DeepResearch-v0")`.
"""

from envs.registration import register_envs

register_envs()
