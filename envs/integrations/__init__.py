"""Adapters that serve DeepResearch-v0 to other environment libraries (optional extras).

They live on the environment side of the layering: they import `envs` and `venus_gym`,
never `trainers`, so a verifiers or OpenEnv user needs no torch.
"""
