"""SFT trajectories from the embedded world, written by the oracle agent (issue 3, item 4).

`generate_oracle_trajectories` runs `venus_gym.worlds.oracle.OracleAgent` through the real
`DeepResearch-v0` environment (train split only, so the held-out "test" tasks stay unseen)
and records each episode as a `trainers.trajectory.Trajectory`: the environment's own
system prompt, the question, every assistant turn and every environment reply, with the
turn kinds, validity and the outcome score the environment gave. `tokenize_trajectories`
adds the token-level view (exact loss masks from the chat template, `check_invariants`).

Long horizons come from a mixture of oracle settings (`OracleMixture`): most episodes take
the direct path, some take random dead ends (`detour_prob`), and some are stretched to a
target length (`target_turns`), which gives a turn histogram with a tail beyond 50 and 100
turns, shaped like the REDSearcher data DR-Venus trains on (design.md "SFT").
Everything is deterministic given `OracleDataConfig.seed`.

Recovery examples (`recovery_prob`): the oracle never makes a mistake, so a model trained
only on its turns has never seen the environment's "Your previous turn was malformed" reply
and, after its first slip, keeps failing (measured: a tiny model's whole episode degenerated
after one malformed turn). With recovery_prob > 0 some turns are preceded by a malformed
attempt (cut off mid-way, a repetition loop, or broken tool-call JSON: the mistakes tiny
models make), the environment's real error reply, and then the oracle's turn. The attempt
is an assistant message with `"weight": 0`: context, never a training target.
`recovery_kinds` picks the attempts' kinds (MALFORMATIONS). "phrase_loop" (opt-in) is the
loop greedy decoding really produces: a phrase of 1-4 words repeated 20-120 times, as when a
turn runs into the token cap. A model that has only seen short loops tends to copy its own
long loop into the next turn and the turn after (measured: 24 of a tiny model's 25 invalid
turns on 53 validation tasks sat in three such cascades).

Where we deviate from DR-Venus and why
* The data is written by a scripted oracle over a generated world, not by a frontier
  model over the web: it runs offline in seconds and its answers are verified by the
  environment, so the LLM-judge correctness filter becomes "keep outcome == 1"
  (`keep_only_correct`). Dead ends are scripted, so their reasoning text is templated.
* Turn-aware resampling (1x / 2x / 5x by length) is a separate data-pipeline step, not
  done here: this module only produces and tokenises trajectories.
"""

from __future__ import annotations

import multiprocessing
import random
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from tqdm import tqdm

import envs  # noqa: F401  (registers the environments)
from trainers.backends import usable_cores
from trainers.modeling.tokenization import ChatTokenizer
from trainers.trajectory import Trajectory, Turn, check_invariants
from venus_gym.protocol import parse_turn
from venus_gym.worlds.oracle import OracleAgent

MALFORMATIONS: tuple[str, ...] = ("cut", "loop", "json", "phrase_loop")
# The kinds recovery examples use unless told otherwise (what runs e10-e13 were trained on).
DEFAULT_RECOVERY_KINDS: tuple[str, ...] = ("cut", "loop", "json")

# Upper bin edges of the turn histogram; the last bin is open-ended. 50 and 100 are the
# DR-Venus resampling thresholds.
HISTOGRAM_EDGES: tuple[int, ...] = (5, 10, 20, 50, 100, 150)


@dataclass(frozen=True)
class OracleMixture:
    """One component of the oracle-settings mixture.

    weight:       relative share of episodes written with these settings.
    detour_prob:  chance of a dead end at each decision point (see OracleAgent).
    target_turns: (low, high) inclusive range; each episode draws a target length from it
                  and the oracle pads itself with dead ends to about that many turns.
                  None = no target (length set by the path and detour_prob).
    style:        "varied" (seeded choice of reasoning templates) or "plain".
    """

    weight: float
    detour_prob: float = 0.0
    target_turns: tuple[int, int] | None = None
    style: str = "varied"


# Default mix: ~55% direct solutions, ~15% with a few random dead ends, and the rest
# stretched to 21-50, 51-100 and 101-160 turns (the > 100-turn tail DR-Venus upweights;
# REDSearcher's raw share of > 100 turns is 13.3%).
DEFAULT_MIXTURE: tuple[OracleMixture, ...] = (
    OracleMixture(weight=0.55),
    OracleMixture(weight=0.15, detour_prob=0.35),
    OracleMixture(weight=0.10, target_turns=(21, 50)),
    OracleMixture(weight=0.10, target_turns=(51, 100)),
    OracleMixture(weight=0.10, target_turns=(101, 160)),
)
SHORT_MIXTURE: tuple[OracleMixture, ...] = (
    OracleMixture(weight=0.8),
    OracleMixture(weight=0.2, detour_prob=0.25),
)
# One reasoning template per situation, direct paths: the easiest data to learn (tests).
PLAIN_MIXTURE: tuple[OracleMixture, ...] = (OracleMixture(weight=1.0, style="plain"),)


@dataclass
class OracleDataConfig:
    """What to generate. env_kwargs go to gym.make("DeepResearch-v0", ...) (task_split is
    forced to "train").

    world_seeds: play in these synthetic worlds instead of env_kwargs' own (the episodes are
    split evenly over them, in order). Training on worlds other than the evaluation world
    means no held-out entity was ever seen: a model can only answer by reading.
    recovery_prob, recovery_kinds: see the module docstring. plan_steps: the oracle writes
    its step plan (OracleAgent).
    """

    num_episodes: int = 200
    seed: int = 0
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    mixture: Sequence[OracleMixture] = DEFAULT_MIXTURE
    keep_only_correct: bool = True
    world_seeds: Sequence[int] = ()
    recovery_prob: float = 0.0
    recovery_kinds: Sequence[str] = DEFAULT_RECOVERY_KINDS
    plan_steps: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.recovery_prob < 1.0:
            raise ValueError(f"recovery_prob must be in [0, 1), got {self.recovery_prob!r}")
        unknown = sorted(set(self.recovery_kinds) - set(MALFORMATIONS))
        if unknown or not self.recovery_kinds:
            raise ValueError(f"recovery_kinds must be a non-empty subset of {MALFORMATIONS}, "
                             f"got {tuple(self.recovery_kinds)!r}")


def make_train_env(env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """DeepResearch-v0 on the train split (the split argument cannot be overridden here)."""
    kwargs = dict(env_kwargs or {})
    kwargs["task_split"] = "train"
    return gym.make("DeepResearch-v0", **kwargs)


def malformed_version(turn: str, rng: random.Random,
                      kinds: Sequence[str] = DEFAULT_RECOVERY_KINDS) -> str | None:
    """A broken copy of a well-formed turn, of a seeded kind drawn from `kinds`
    (MALFORMATIONS): cut before its last closing tag; cut and then one word repeated 8-40
    times (a short loop); cut and then its last 1-4 words repeated 20-120 times (a loop run
    into the token cap); or one character of the tool call's JSON dropped. None when no
    kind yields a turn the protocol rejects."""
    close = turn.rfind("</")
    if close < 2:
        return None
    kinds = list(kinds)
    rng.shuffle(kinds)
    for kind in kinds:
        cut = rng.randint(1, close - 1)
        if kind == "cut":
            broken = turn[:cut]
        elif kind == "loop":
            words = turn[:cut].split()
            broken = turn[:cut] + (" " + words[-1]) * rng.randint(8, 40) if words else turn[:cut]
        elif kind == "phrase_loop":
            words = turn[:cut].split()
            phrase = " ".join(words[-rng.randint(1, min(4, len(words))):]) if words else ""
            broken = turn[:cut] + (" " + phrase) * rng.randint(20, 120)
        else:
            body_start = turn.find("{")
            if body_start < 0:
                continue
            punctuation = [i for i, ch in enumerate(turn) if ch in '"{}:,' and i > body_start]
            drop = rng.choice(punctuation) if punctuation else body_start
            broken = turn[:drop] + turn[drop + 1:]
        if not parse_turn(broken).valid:
            return broken
    return None


def _room_for_a_mistake(base: Any, broken: str) -> bool:
    """Whether a malformed turn can be spent without reaching a turn or context budget (the
    reply would then be the final-answer notice, not the error the example is about)."""
    cfg = base.config
    context_left = cfg.max_context_tokens - base.tokens_used - base.count_tokens(broken)
    return not base.forced_final and base.turn + 2 < cfg.max_turns and context_left > 8192


def run_oracle_episode(env: gym.Env, task_index: int, agent_seed: int,
                       mixture: OracleMixture, target_turns: int | None,
                       trajectory_id: str, recovery_prob: float = 0.0,
                       plan_steps: bool = True,
                       recovery_kinds: Sequence[str] = DEFAULT_RECOVERY_KINDS) -> Trajectory:
    """Play one oracle episode on task `task_index` and record it as a text Trajectory.
    recovery_prob: the chance that a turn is first tried malformed, in one of
    recovery_kinds (module docstring).
    plan_steps: the oracle writes its step plan (OracleAgent)."""
    base = env.unwrapped
    observation, info = env.reset(seed=agent_seed, options={"task_index": task_index})
    task = base.task
    agent = OracleAgent(task, rng_seed=agent_seed, detour_prob=mixture.detour_prob,
                        target_turns=target_turns, style=mixture.style, plan_steps=plan_steps)
    messages: list[dict[str, Any]] = [{"role": "system", "content": base.system_prompt},
                                      {"role": "user", "content": observation}]
    turns: list[Turn] = []
    outcome = 0.0
    done = False
    rng = random.Random(f"recovery:{agent_seed}")
    while not done:
        action = agent.act(observation)
        broken = malformed_version(action, rng, recovery_kinds) \
            if rng.random() < recovery_prob else None
        if broken is not None and _room_for_a_mistake(base, broken):
            error_reply, _, _, truncated, info = env.step(broken)
            if info["valid"] or truncated:
                raise RuntimeError(f"{trajectory_id}: the environment accepted a malformed turn "
                                   f"or ended the episode on it: {broken!r}")
            messages += [{"role": "assistant", "content": broken, "weight": 0},
                         {"role": "user", "content": error_reply}]
            # No format penalty recorded: rewards land on policy tokens, and this turn has
            # none (weight 0).
            turns.append(Turn(kind=info["kind"], valid=False, assistant=broken,
                              env_reply=error_reply, reason=str(info["reason"])))
        observation, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        messages.append({"role": "assistant", "content": action})
        reply = observation if observation else None
        if reply is not None:
            messages.append({"role": "user", "content": reply})
        turns.append(Turn(kind=info["kind"], valid=bool(info["valid"]), assistant=action,
                          env_reply=reply, reason="" if info["valid"] else info["reason"],
                          forced_final=bool(info.get("forced_final")) and done))
        if terminated:
            outcome = float(info.get("score", 0.0))
    turns[-1].outcome_reward = outcome
    return Trajectory(
        id=trajectory_id, messages=messages, task_id=task.id, question=task.question,
        answers=list(task.answers), turns=turns, outcome=outcome,
        metadata={"source": "oracle", "hops": task.hops, "agent_seed": agent_seed,
                  "detour_prob": mixture.detour_prob, "target_turns": target_turns,
                  "style": mixture.style, "recovery_prob": recovery_prob,
                  "recovery_kinds": list(recovery_kinds), "plan_steps": plan_steps})


def generate_oracle_trajectories(config: OracleDataConfig, workers: int = 1,
                                 progress: bool = False) -> list[Trajectory]:
    """`config.num_episodes` oracle episodes on train-split tasks, as text Trajectories.

    Tasks are visited in a seeded shuffled order (cycled, each pass reshuffled), so every
    task is used before any repeats; each episode draws its mixture component and agent seed
    from one seeded RNG, so the output is a pure function of the config. With
    keep_only_correct, unsolved episodes are dropped (fewer than num_episodes may return).
    With world_seeds, world k of n plays episodes k * N / n .. (k + 1) * N / n - 1.

    workers > 1 plays the episodes in that many processes (0 = one per CPU core). The RNG
    draws do not depend on how an episode goes, so they are all made first, in order, and
    the output is identical for any number of workers.
    """
    if not config.mixture:
        raise ValueError("the oracle mixture is empty")
    workers = resolve_workers(workers)
    rng = random.Random(f"oracle-data:{config.seed}")
    seeds = list(config.world_seeds) or [None]
    worlds = []
    for world_seed in seeds:
        env_kwargs = dict(config.env_kwargs)
        if world_seed is not None:
            env_kwargs["world_seed"] = world_seed
        worlds.append(env_kwargs)
    bar = tqdm(total=config.num_episodes, desc="oracle episodes", unit="episode",
               disable=not progress, file=sys.stderr)
    trajectories: list[Trajectory] = []
    if workers == 1:
        with bar:
            for k, env_kwargs in enumerate(worlds):
                env = make_train_env(env_kwargs)
                plan = _plan_world(config, k, len(seeds), _train_task_count(env), rng)
                trajectories += _play(config, env, plan, bar)
                env.close()
        return trajectories
    with _process_pool(workers) as pool, bar:
        counts = list(pool.map(_world_task_count, worlds))
        size = max(1, -(-config.num_episodes // (4 * workers)))  # ~4 chunks per worker
        chunks = []
        for k, env_kwargs in enumerate(worlds):  # chunks stay within one world
            plan = _plan_world(config, k, len(seeds), counts[k], rng)
            chunks += [(env_kwargs, plan[i:i + size]) for i in range(0, len(plan), size)]
        return _results_in_order(pool, [(_play_chunk, config, env_kwargs, chunk)
                                        for env_kwargs, chunk in chunks],
                                 [len(chunk) for _, chunk in chunks], bar)


def _process_pool(workers: int) -> ProcessPoolExecutor:
    # spawn, not fork: forking a process whose torch already runs threads can deadlock.
    return ProcessPoolExecutor(max_workers=workers,
                               mp_context=multiprocessing.get_context("spawn"))


def _results_in_order(pool: ProcessPoolExecutor, calls: Sequence[tuple], sizes: Sequence[int],
                      bar: Any) -> list:
    """Run each (function, *args) of `calls` in `pool` and concatenate their list results
    in the order given. A failing call cancels the ones not yet started and re-raises at
    once instead of after all the others have run."""
    futures = [pool.submit(function, *args) for function, *args in calls]
    results: list = []
    try:
        for size, future in zip(sizes, futures):
            results += future.result()
            bar.update(size)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    return results


def resolve_workers(workers: int) -> int:
    """A worker count: n >= 1 as given, 0 = one per CPU core this process may use."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise ValueError(f"workers must be an int >= 0 (0 = one per CPU core), got {workers!r}")
    return workers or usable_cores()


@dataclass(frozen=True)
class _PlannedEpisode:
    """The RNG draws of one episode, made before it is played."""

    episode: int
    task_index: int
    component: OracleMixture
    target_turns: int | None
    agent_seed: int


def _train_task_count(env: gym.Env) -> int:
    task_count = len(env.unwrapped.tasks)
    if task_count == 0:
        raise ValueError("the train split has no tasks for these env settings")
    return task_count


def _world_task_count(env_kwargs: dict[str, Any]) -> int:
    env = make_train_env(env_kwargs)
    try:
        return _train_task_count(env)
    finally:
        env.close()


def _plan_world(config: OracleDataConfig, k: int, worlds: int, task_count: int,
                rng: random.Random) -> list[_PlannedEpisode]:
    """World k's episodes: each one's task, mixture component, target length and agent seed,
    drawn from the shared `rng` in episode order."""
    weights = [component.weight for component in config.mixture]
    order: list[int] = []
    plan = []
    for episode in range(k * config.num_episodes // worlds,
                         (k + 1) * config.num_episodes // worlds):
        if not order:
            order = list(range(task_count))
            rng.shuffle(order)
        task_index = order.pop()
        component = rng.choices(list(config.mixture), weights=weights)[0]
        target = None if component.target_turns is None else rng.randint(*component.target_turns)
        plan.append(_PlannedEpisode(episode, task_index, component, target,
                                    rng.randrange(1 << 30)))
    return plan


def _play(config: OracleDataConfig, env: gym.Env, plan: Sequence[_PlannedEpisode],
          bar: Any = None) -> list[Trajectory]:
    trajectories = []
    for planned in plan:
        trajectory = run_oracle_episode(env, planned.task_index, planned.agent_seed,
                                        planned.component, planned.target_turns,
                                        trajectory_id=f"oracle-{config.seed}-{planned.episode:06d}",
                                        recovery_prob=config.recovery_prob,
                                        plan_steps=config.plan_steps,
                                        recovery_kinds=config.recovery_kinds)
        if bar is not None:
            bar.update(1)
        if config.keep_only_correct and trajectory.outcome != 1.0:
            continue
        trajectories.append(trajectory)
    return trajectories


def _play_chunk(config: OracleDataConfig, env_kwargs: dict[str, Any],
                plan: Sequence[_PlannedEpisode]) -> list[Trajectory]:
    """A worker process's share: some planned episodes of one world."""
    env = make_train_env(env_kwargs)
    try:
        return _play(config, env, plan)
    finally:
        env.close()


def tokenize_trajectories(trajectories: Iterable[Trajectory], chat: ChatTokenizer | Any,
                          check: bool = True, workers: int = 1,
                          progress: bool = False) -> list[Trajectory]:
    """Copies with the token-level view (chat template ids, exact loss masks), in order.

    chat: a ChatTokenizer or a Hugging Face tokenizer with a chat template.
    check: run check_invariants on each result (cheap next to tokenisation).
    workers: processes that tokenize (0 = one per CPU core); the result does not depend on
    it. Tokenizing is the slow half of oracle data (~25 ms per 2K-token episode: the chat
    template is re-encoded per message to find the exact mask boundaries).
    """
    chat = chat if isinstance(chat, ChatTokenizer) else ChatTokenizer(chat)
    trajectories = list(trajectories)
    workers = resolve_workers(workers)
    bar = tqdm(total=len(trajectories), desc="tokenizing", unit="trajectory",
               disable=not progress, file=sys.stderr)
    if workers == 1:
        tokenized = []
        with bar:
            for trajectory in trajectories:
                tokenized += _tokenize_chunk(chat, [trajectory], check)
                bar.update(1)
        return tokenized
    size = max(1, -(-len(trajectories) // (4 * workers)))
    chunks = [trajectories[i:i + size] for i in range(0, len(trajectories), size)]
    with _process_pool(workers) as pool, bar:
        return _results_in_order(pool, [(_tokenize_chunk, chat, chunk, check)
                                        for chunk in chunks], [len(c) for c in chunks], bar)


def _tokenize_chunk(chat: ChatTokenizer, trajectories: Sequence[Trajectory],
                    check: bool) -> list[Trajectory]:
    tokenized = []
    for trajectory in trajectories:
        with_tokens = trajectory.with_tokens(chat.tokenize(trajectory.messages))
        if check:
            check_invariants(with_tokens)
        tokenized.append(with_tokens)
    return tokenized


def world_texts(env_kwargs: dict[str, Any] | None = None) -> list[str]:
    """Texts to train a world-specific tokenizer on: the system prompt, every page (title and
    text) and every question of the world (all splits: a tokenizer sees no answers it could
    leak)."""
    env = make_train_env(env_kwargs)
    world = env.unwrapped.world
    texts = [env.unwrapped.system_prompt]
    for page in world.corpus:
        texts.append(f"{page.title}\n{page.url}\n{page.text}\n{page.snippet}")
    texts.extend(task.question for task in world.tasks)
    env.close()
    return texts


def turn_histogram(trajectories: Iterable[Trajectory],
                   edges: Sequence[int] = HISTOGRAM_EDGES) -> dict[str, int]:
    """Counts of trajectories by number of assistant turns: bins "1-5", "6-10", ..., ">150"."""
    labels, low = [], 1
    for edge in edges:
        labels.append(f"{low}-{edge}")
        low = edge + 1
    labels.append(f">{edges[-1]}")
    counts = dict.fromkeys(labels, 0)
    for trajectory in trajectories:
        n_turns = sum(message["role"] == "assistant" for message in trajectory.messages)
        bin_index = next((i for i, edge in enumerate(edges) if n_turns <= edge), len(edges))
        counts[labels[bin_index]] += 1
    return counts


def format_histogram(counts: dict[str, int]) -> str:
    """A small text bar chart of turn_histogram's counts."""
    total = max(1, sum(counts.values()))
    width = max(len(label) for label in counts)
    return "\n".join(f"{label:>{width}} turns | {count:5d} ({100 * count / total:5.1f}%) "
                     f"{'#' * round(40 * count / total)}" for label, count in counts.items())
