"""`venus-gym chat`: ask the agent a question and watch it work, turn by turn, in a terminal.

    venus-gym chat --policy runs/demo/sft/final                 # the generated world
    venus-gym chat --policy DIR --world hotpotqa                # the packaged HotpotQA pages
    venus-gym chat --endpoint http://127.0.0.1:8000/v1 --model m --tokenizer DIR \\
                   --env search_backend=retrieval --env retrieval_url=http://...  # a retriever

Each question is one DeepResearch-v0 episode over the chosen world's pages (or a retrieval
server), played by `trainers.rollout.play_episode`, the episode runner of rollouts and
evaluation (a group of one); every turn is printed as it comes back: the reasoning, the tool
call, the tool's response (shortened), then the answer. A question that is one of the world's tasks (same text) is scored against
its gold answers. Ctrl-C (or end of input) ends the session without a traceback; Ctrl-C
during an episode ends that episode and the program.

Where we deviate from DR-Venus's inference and why: turns are shown whole, when the model
has finished each (the episode runner generates a turn, then hands it to the env); token
by token streaming would need a second decode loop next to the engines'.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, TextIO

from trainers.evaluation.viewer import split_turn

REPLY_CHARS = 600  # of a tool response shown per turn
_COLOURS = {"think": "\033[3;35m", "call": "\033[34m", "answer": "\033[1;32m",
            "text": "", "reply": "\033[33m", "bad": "\033[31m", "dim": "\033[2m"}
_RESET = "\033[0m"
_LABELS = {"think": "reasoning", "call": "tool call", "answer": "answer", "text": "text"}


class Narrator:
    """Prints an episode as the env sees it: each action's parts, then the env's reply."""

    def __init__(self, env: Any, out: TextIO, colour: bool):
        import gymnasium as gym

        class _Wrapper(gym.Wrapper):
            def step(inner, action: str) -> Any:  # noqa: N805 (the wrapper's self)
                self.show_action(action, inner.env.unwrapped.turn + 1)
                result = inner.env.step(action)
                self.show_result(*result)
                return result

        self.env = _Wrapper(env)
        self.out = out
        self.colour = colour

    def paint(self, kind: str, text: str) -> str:
        return f"{_COLOURS[kind]}{text}{_RESET}" if self.colour and _COLOURS[kind] else text

    def show_action(self, action: str, turn: int) -> None:
        self.out.write(self.paint("dim", f"--- turn {turn}") + "\n")
        for part in split_turn(action) or [{"kind": "text", "text": action}]:
            self.out.write(self.paint(part["kind"], f"[{_LABELS[part['kind']]}] {part['text']}")
                           + "\n")
        self.out.flush()

    def show_result(self, observation: str, reward: float, terminated: bool, truncated: bool,
                    info: dict[str, Any]) -> None:
        if not info.get("valid", True):
            self.out.write(self.paint("bad", f"[malformed] {info.get('reason', '')}") + "\n")
        if observation:
            shown = observation if len(observation) <= REPLY_CHARS else (
                observation[:REPLY_CHARS] + f" [... {len(observation) - REPLY_CHARS} more chars]")
            self.out.write(self.paint("reply", f"[tool response] {shown}") + "\n")
        if terminated or truncated:
            end = "answered" if terminated else f"stopped ({info.get('budget') or 'budget'})"
            self.out.write(self.paint("dim", f"--- {end} after {info.get('turn')} turns") + "\n")
        self.out.flush()


@dataclasses.dataclass
class ChatSession:
    """The world and the policy one `venus-gym chat` talks to."""

    engine: Any
    chat: Any
    world: Any
    env_kwargs: dict[str, Any]
    sampling: Any = None

    def ask(self, question: str, out: TextIO, colour: bool = False) -> Any:
        """Play one episode on `question`; returns its trajectory."""
        import gymnasium as gym

        import envs  # noqa: F401  (registers the environments)
        from trainers.rollout import play_episode
        from venus_gym.corpus import Task

        known = next((t for t in self._tasks if t.question.strip() == question.strip()), None)
        task = known or Task(id="chat", question=question, answers=("(no gold answer)",))
        self.world.tasks[:] = [task]  # the same World object: its search index is reused
        env = gym.make("DeepResearch-v0", **{**self.env_kwargs, "world": self.world,
                                              "task_split": "all"})
        narrator = Narrator(env, out, colour)
        try:
            trajectory = play_episode(self.engine, narrator.env, self.chat, task_index=0,
                                      seed=0, sampling=self.sampling, trajectory_id="chat")
        finally:
            env.close()
        if known is not None:
            out.write(f"gold: {' | '.join(known.answers)}  (score {trajectory.outcome:.2f})\n")
        return trajectory

    def __post_init__(self) -> None:
        self._tasks = list(self.world.tasks)


def build_session(args: Any) -> ChatSession:
    """The ChatSession of the parsed `venus-gym chat` options."""
    from trainers.evaluation.run import EvalRunConfig, load_evaluated_policy, with_policy_defaults
    from trainers.rollout import SamplingConfig, text_token_counter
    from venus_gym.corpus import World
    from venus_gym.worlds import load_world

    generated = args.world == "synthetic"
    config = EvalRunConfig(out="-", policy=args.policy, endpoint=args.endpoint,
                           model=args.model, tokenizer=args.tokenizer, k=1,
                           max_turn_tokens=args.max_turn_tokens,
                           temperature=args.temperature, env=_env_options(args.env or []),
                           benchmark="generated" if generated else args.world)
    # The policy's recorded env settings (prompt style, search width) unless --env sets them.
    env = with_policy_defaults(config, lambda line: print(line, file=sys.stderr)).env
    config.validate()
    engine, chat = load_evaluated_policy(config)
    sampling = SamplingConfig(max_turn_tokens=args.max_turn_tokens,
                              temperature=config.sampling_temperature, seed=0)
    base = (load_world("synthetic", n_pages=args.world_size, seed=args.world_seed)
            if args.world == "synthetic" else load_world(args.world))
    world = World(name=base.name, corpus=base.corpus, tasks=list(base.tasks), meta=base.meta)
    return ChatSession(engine, chat, world, {**env, "max_turns": args.max_turns,
                                             "token_counter": text_token_counter(chat)},
                       sampling)


def _env_options(items: list[str]) -> dict[str, Any]:
    # Typed as eval's --env and the config files are; a bad value is one line, not a trace.
    from trainers.config_yaml import parse_env_options

    return parse_env_options(items)


def chat_loop(session: ChatSession, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout,
              colour: bool | None = None) -> int:
    """Read questions until end of input or Ctrl-C; returns the exit status (0)."""
    colour = out.isatty() if colour is None else colour
    out.write("Ask a question (Ctrl-C or Ctrl-D to quit).\n")
    try:
        while True:
            out.write("question> ")
            out.flush()
            line = stdin.readline()
            if not line:
                break
            if line.strip():
                session.ask(line.strip(), out, colour)
    except KeyboardInterrupt:
        pass
    out.write("\nbye\n")
    out.flush()
    return 0


def main_args(args: Any) -> int:
    try:
        session = build_session(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"venus-gym chat: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return chat_loop(session)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--policy", help="a saved policy directory")
    parser.add_argument("--endpoint", help="an OpenAI-compatible API root (instead of --policy)")
    parser.add_argument("--model", default="policy", help="the endpoint's model name")
    parser.add_argument("--tokenizer", help="endpoint only: the served model's tokenizer dir")
    parser.add_argument("--world", default="synthetic",
                        help="'synthetic' (generated world), 'hotpotqa', a QA JSONL or a "
                             "saved world directory")
    parser.add_argument("--world-size", type=int, default=2000, help="synthetic world pages")
    parser.add_argument("--world-seed", type=int, default=0, help="synthetic world seed")
    parser.add_argument("--max-turns", type=int, default=20, help="turns per question")
    parser.add_argument("--max-turn-tokens", type=int, default=512, help="tokens per turn")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE",
                        help="other DeepResearch-v0 arguments (venus-gym env-help), e.g. "
                             "search_backend=retrieval retrieval_url=URL for a retriever")


__all__ = ["ChatSession", "Narrator", "add_arguments", "build_session",
           "chat_loop"]
