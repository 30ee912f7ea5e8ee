"""The Gymnasium ids of the DeepResearch environments, as data.

`import venus_gym` registers them, so `gym.make("DeepResearch-v0")` works after importing
either the core package or `envs`. Registration is lazy: each entry point is a string that
Gymnasium imports on the first `gym.make`, so importing venus_gym loads neither envs nor its
dependencies (tests/test_layering.py allows exactly these strings here).
"""

from __future__ import annotations

ENV_SPECS: tuple[dict, ...] = (
    {
        "id": "DeepResearch-v0",
        "entry_point": "envs.deep_research:DeepResearchEnv",
        "kwargs": {},
        "doc": "Embedded generated research world (offline, seeded; world_size pages).",
    },
    {
        "id": "DeepResearch-HotpotQA-v0",
        "entry_point": "envs.deep_research:DeepResearchEnv",
        "kwargs": {"world": "hotpotqa", "reward_metric": "f1"},
        "doc": "500 HotpotQA dev (distractor) questions over their own 4,931 paragraphs.",
    },
)


def register_envs() -> None:
    """Register every id of ENV_SPECS that Gymnasium does not know yet."""
    import gymnasium as gym

    for spec in ENV_SPECS:
        if spec["id"] in gym.registry:
            continue
        gym.register(id=spec["id"], entry_point=spec["entry_point"],
                     kwargs=dict(spec["kwargs"]))
