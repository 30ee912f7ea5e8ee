"""The verifiers plug-in id `deep-research-v0` (verifiers imports a plug-in by its module
name, and only an undotted one): re-exports `envs.integrations.verifiers`."""

from envs.integrations.verifiers import DeepResearchChat, DeepResearchTaskset, DeepResearchVfEnv

__all__ = ["DeepResearchChat", "DeepResearchTaskset", "DeepResearchVfEnv"]
