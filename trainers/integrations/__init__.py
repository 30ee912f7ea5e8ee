"""Adapters that run DeepResearch-v0 inside other training libraries (optional extras)."""
