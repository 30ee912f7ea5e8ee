"""Environment ids this package registers with Gymnasium (registration is data).

`import envs` registers them; `gym.make("envs:DeepResearch-v0")` imports the package for
you. Registration lives here, next to the environment it points at, rather than in
venus_gym: venus_gym (protocol, tools, worlds) must not depend on envs.
"""

from __future__ import annotations

import gymnasium as gym

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
    for spec in ENV_SPECS:
        if spec["id"] in gym.registry:
            continue
        gym.register(id=spec["id"], entry_point=spec["entry_point"],
                     kwargs=dict(spec["kwargs"]))
