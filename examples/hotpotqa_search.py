"""Search and read real HotpotQA paragraphs through DeepResearch-HotpotQA-v0.

    python examples/hotpotqa_search.py
    python examples/hotpotqa_search.py --world tests/data/musique_ans_dev_20.jsonl

Writes the agent's turns by hand: search each supporting paragraph's title, visit it
with the question as the goal, and print what the environment returns.
"""

import argparse

import gymnasium as gym

import envs  # noqa: F401  (registers the environments)
from venus_gym.protocol import format_tool_turn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", default="hotpotqa", help="'hotpotqa' or a QA JSONL path")
    ap.add_argument("--task-index", type=int, default=0)
    args = ap.parse_args()

    env = gym.make("DeepResearch-v0", world=args.world, reward_metric="f1").unwrapped
    question, info = env.reset(options={"task_index": args.task_index})
    print(f"question: {question}\n")
    for url in env.task.gold_urls:
        title = env.world.corpus.get(url).title
        obs, *_ = env.step(format_tool_turn("Find the page.", "search", {"query": [title]}))
        print(obs[:700], "\n")
        obs, *_ = env.step(format_tool_turn("Read it.", "visit",
                                            {"url": [url], "goal": question}))
        print(obs, "\n")
    print(f"gold answers: {list(env.task.answers)}")


if __name__ == "__main__":
    main()
