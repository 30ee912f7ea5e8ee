"""The oracle agent against a hand-made observer built from a world's pages: it solves
tasks when the facts are shown, refuses to answer when they are hidden, takes dead ends
when asked, and is deterministic."""

from __future__ import annotations

from collections import Counter

import pytest

from venus_gym.corpus import Task, World
from venus_gym.protocol import FORCED_FINAL_NOTICE, format_tool_response, parse_turn
from venus_gym.worlds.oracle import UNKNOWN_ANSWER, OracleAgent, mentions
from venus_gym.worlds.synthetic import generate_world


@pytest.fixture(scope="module")
def world() -> World:
    return generate_world(n_pages=400, seed=5)


def _sample(world: World, per_hop: int = 8) -> list[Task]:
    taken: Counter = Counter()
    tasks = []
    for task in world.tasks:
        if taken[task.hops] < per_hop:
            taken[task.hops] += 1
            tasks.append(task)
    return tasks


class FakeObserver:
    """Plays the environment: search lists pages whose title or text contains the query,
    visit returns the whole page text (a perfect summarizer).

    hide: values blanked out of every visit result.
    unlisted: urls that search never returns.
    """

    def __init__(self, world: World, hide: tuple[str, ...] = (), unlisted: tuple[str, ...] = ()):
        self.world, self.hide, self.unlisted = world, hide, set(unlisted)

    def __call__(self, turn: str) -> str:
        parsed = parse_turn(turn)
        assert parsed.kind in ("search", "visit"), (parsed.kind, parsed.reason, turn)
        args = parsed.tool_call.arguments
        if parsed.kind == "search":
            blocks = []
            for query in args["query"]:
                q = query.casefold()
                hits = [p for p in self.world.corpus if p.url not in self.unlisted
                        and (q in p.title.casefold() or q in p.text.casefold())]
                hits.sort(key=lambda p: q not in p.title.casefold())
                blocks.append("\n".join(f"{i}. [{p.title}]({p.url})\n{p.snippet}"
                                        for i, p in enumerate(hits[:10], start=1)))
            return format_tool_response("\n=======\n".join(blocks) or "No results.")
        texts = []
        for url in args["url"]:
            text = self.world.corpus.get(url).text
            for value in self.hide:
                text = text.replace(value, "[...]")
            texts.append(f"The useful information in {url} for user goal {args['goal']}:\n{text}")
        return format_tool_response("\n".join(texts))


def _episode(agent: OracleAgent, observe, limit: int = 400) -> list[str]:
    turns = [agent.act(agent.task.question)]
    while not agent.done:
        assert len(turns) < limit, "oracle did not finish"
        turns.append(agent.act(observe(turns[-1])))
    return turns


def _tool_keys(turns: list[str]) -> list[tuple]:
    keys = []
    for turn in turns:
        call = parse_turn(turn).tool_call
        if call is not None:
            items = call.arguments.get("query") or call.arguments.get("url")
            keys.append((call.name, frozenset(items)))
    return keys


def test_solves_every_task_in_the_minimum_turns_on_a_perfect_observer(world):
    observe = FakeObserver(world)
    for task in _sample(world):
        turns = _episode(OracleAgent(task, rng_seed=1), observe)
        assert len(turns) == 2 * task.hops + 1, task.id
        final = parse_turn(turns[-1])
        assert final.kind == "answer" and final.answer == task.answers[0]
        assert all(parse_turn(t).kind in ("search", "visit") for t in turns[:-1])
        visited = [parse_turn(t).tool_call.arguments["url"][0] for t in turns
                   if parse_turn(t).kind == "visit"]
        assert visited == list(task.gold_urls)


def test_no_reasoning_mentions_a_value_before_the_page_showing_it_was_read(world):
    observe = FakeObserver(world)
    for task in _sample(world):
        turns = _episode(OracleAgent(task, rng_seed=2), observe)
        visits = [i for i, t in enumerate(turns) if parse_turn(t).kind == "visit"]
        for hop, visit_index in zip(task.gold_path, visits):
            if mentions(task.question, hop["value"]):
                continue
            for turn in turns[:visit_index + 1]:
                assert not mentions(parse_turn(turn).think, hop["value"]), (task.id, turn)


@pytest.mark.parametrize("style", ["varied", "plain"])
def test_first_turn_decomposes_the_question_and_later_searches_restate_their_step(world, style):
    observe = FakeObserver(world)
    for task in (t for t in _sample(world) if t.hops >= 2):
        turns = _episode(OracleAgent(task, rng_seed=3, style=style), observe)
        clauses = [hop["goal"].removeprefix("Find ") for hop in task.gold_path]
        plan = parse_turn(turns[0]).think
        assert f"Step 1: {clauses[0]}." in plan, (task.id, plan)
        for number, (hop, clause) in enumerate(zip(task.gold_path[1:], clauses[1:]), start=2):
            # Unknown before reading: the plan names the entity by the step that finds it.
            assert f"Step {number}: {clause.replace(hop['entity'], f'#{number - 1}')}." in plan
            searches = [parse_turn(t) for t in turns if parse_turn(t).kind == "search"
                        and parse_turn(t).tool_call.arguments["query"][0] == hop["entity"]]
            assert searches and f"Step {number}: {clause}." in searches[0].think, task.id


@pytest.mark.parametrize("style", ["varied", "plain"])
def test_without_plan_steps_the_same_actions_are_written_without_steps(world, style):
    for task in _sample(world):
        with_steps = _episode(OracleAgent(task, rng_seed=4, style=style), FakeObserver(world))
        without = _episode(OracleAgent(task, rng_seed=4, style=style, plan_steps=False),
                           FakeObserver(world))
        assert [parse_turn(t).tool_call for t in without] == \
            [parse_turn(t).tool_call for t in with_steps], task.id
        assert any("Step 1:" in parse_turn(t).think for t in with_steps), task.id
        for turn in without:
            think = parse_turn(turn).think
            assert "Step " not in think and "  " not in think and think == think.strip(), turn


@pytest.mark.parametrize("hidden_hop", [0, -1])
def test_does_not_claim_the_answer_when_a_hop_value_is_hidden(world, hidden_hop):
    for task in _sample(world, per_hop=4):
        hop = task.gold_path[hidden_hop]
        agent = OracleAgent(task, rng_seed=0)
        turns = _episode(agent, FakeObserver(world, hide=(hop["value"],)))
        assert agent.answer == UNKNOWN_ANSWER
        final = parse_turn(turns[-1])
        assert final.answer == UNKNOWN_ANSWER
        assert not any(mentions(final.think, a) for a in task.answers)
        # It re-read the page once with a different goal before giving up.
        visits = [parse_turn(t).tool_call.arguments for t in turns if parse_turn(t).kind == "visit"]
        assert visits[-1]["url"] == visits[-2]["url"] == [hop["url"]]
        assert visits[-1]["goal"] != visits[-2]["goal"]


def test_rephrases_once_then_visits_a_page_search_never_lists(world):
    for task in _sample(world, per_hop=3):
        observe = FakeObserver(world, unlisted=task.gold_urls)
        agent = OracleAgent(task, rng_seed=4)
        turns = _episode(agent, observe)
        assert agent.answer == task.answers[0]
        assert len(turns) == 3 * task.hops + 1
        assert len(set(_tool_keys(turns))) == len(_tool_keys(turns))


def test_detours_make_longer_trajectories_that_still_answer_correctly(world):
    tasks = [t for t in world.tasks if t.hops >= 3][:10]
    observe = FakeObserver(world)
    plain = sum(len(_episode(OracleAgent(t, rng_seed=i), observe)) for i, t in enumerate(tasks))
    detour_turns = 0
    for i, task in enumerate(tasks):
        agent = OracleAgent(task, rng_seed=i, detour_prob=0.6)
        turns = _episode(agent, observe)
        assert agent.answer == task.answers[0]
        assert agent.detours > 0
        keys = _tool_keys(turns)
        assert len(set(keys)) == len(keys), "a dead end repeated an earlier tool call"
        detour_turns += len(turns)
    assert detour_turns > 1.5 * plain


def test_target_turns_gives_a_long_tail_trajectory(world):
    task = next(t for t in world.tasks if t.hops == 4)
    agent = OracleAgent(task, rng_seed=0, target_turns=110)
    turns = _episode(agent, FakeObserver(world))
    assert 100 <= len(turns) <= 115
    assert agent.answer == task.answers[0]
    thinks = " ".join(parse_turn(t).think for t in turns)
    assert "not what I need" in thinks or "dead end" in thinks or "irrelevant" in thinks
    keys = _tool_keys(turns)
    assert len(set(keys)) == len(keys)


def test_max_detours_caps_dead_ends(world):
    task = next(t for t in world.tasks if t.hops == 3)
    agent = OracleAgent(task, rng_seed=0, detour_prob=1.0, max_detours=4)
    turns = _episode(agent, FakeObserver(world))
    assert agent.detours == 4 and len(turns) == 2 * 3 + 1 + 4


def test_same_seed_same_turns_and_seeds_vary_the_wording(world):
    observe = FakeObserver(world)
    tasks = _sample(world, per_hop=3)
    for task in tasks:
        a = _episode(OracleAgent(task, rng_seed=3, detour_prob=0.5), observe)
        b = _episode(OracleAgent(task, rng_seed=3, detour_prob=0.5), observe)
        assert a == b
    differs = [_episode(OracleAgent(t, rng_seed=1), observe)
               != _episode(OracleAgent(t, rng_seed=2), observe) for t in tasks]
    assert sum(differs) >= len(tasks) // 2


def test_plain_style_is_the_same_for_every_seed(world):
    observe = FakeObserver(world)
    task = next(t for t in world.tasks if t.hops == 2)
    runs = {tuple(_episode(OracleAgent(task, rng_seed=s, style="plain"), observe))
            for s in range(4)}
    assert len(runs) == 1


def test_forced_final_notice_gets_an_answer_only_if_verified(world):
    task = next(t for t in world.tasks if t.hops == 2)
    observe = FakeObserver(world)
    early = OracleAgent(task)
    turn = early.act(task.question)
    early.act(observe(turn))
    final = parse_turn(early.act(FORCED_FINAL_NOTICE))
    assert early.done and final.answer == UNKNOWN_ANSWER

    late = OracleAgent(task)
    turns = [late.act(task.question)]
    for _ in range(2 * task.hops - 1):
        turns.append(late.act(observe(turns[-1])))
    observe(turns[-1])  # the last visit is answered, then the budget runs out
    # The notice replaces the last observation, so the final value was never seen.
    assert parse_turn(late.act(FORCED_FINAL_NOTICE)).answer == UNKNOWN_ANSWER

    # Every hop confirmed, a dead end under way (target_turns), then the budget runs out.
    verified = OracleAgent(task, target_turns=30)
    turn = verified.act(task.question)
    while True:
        call = parse_turn(turn).tool_call
        last_visit = call.name == "visit" and call.arguments["url"] == [task.gold_urls[-1]]
        turn = verified.act(observe(turn))
        if last_visit:
            break
    assert parse_turn(turn).kind != "answer"
    assert parse_turn(verified.act(FORCED_FINAL_NOTICE)).answer == task.answers[0]
    with pytest.raises(RuntimeError):
        verified.act("more")


def test_real_data_task_answers_only_what_a_page_showed():
    def task(answer: str) -> Task:
        path = ({"entity": "Page A", "url": "https://x/wiki/Page_A", "goal": "Find a",
                 "value": ""},
                {"entity": "Page B", "url": "https://x/wiki/Page_B", "goal": "Find b",
                 "value": ""})
        return Task(id="t", question="Q?", answers=(answer,), hops=2,
                    gold_urls=tuple(h["url"] for h in path), gold_path=path)

    def run(agent: OracleAgent, page_text: str) -> str:
        observation = agent.task.question
        while not agent.done:
            turn = parse_turn(agent.act(observation))
            urls = turn.tool_call.arguments.get("url", []) if turn.tool_call else []
            listing = "\n".join(f"1. [{h['entity']}]({h['url']})\nx" for h in agent.task.gold_path)
            observation = format_tool_response(page_text if urls else listing)
        return agent.answer

    assert run(OracleAgent(task("Lima")), "The capital is Lima.") == "Lima"
    assert run(OracleAgent(task("Lima")), "Nothing relevant.") == UNKNOWN_ANSWER
    assert run(OracleAgent(task("yes")), "Nothing relevant.") == "yes"


def test_plan_from_bare_gold_urls_and_argument_checks():
    bare = Task(id="b", question="Q?", answers=("x",), gold_urls=("https://x/wiki/Some_Page",))
    assert OracleAgent(bare).hops[0].entity == "Some Page"
    with pytest.raises(ValueError, match="no usable gold_path"):
        OracleAgent(Task(id="n", question="Q?", answers=("x",)))
    for kwargs in ({"detour_prob": 1.5}, {"max_detours": -1}, {"target_turns": 0},
                   {"style": "fancy"}):
        with pytest.raises(ValueError):
            OracleAgent(bare, **kwargs)


def test_mentions_respects_word_boundaries():
    assert mentions("Founded in 1873.", "1873")
    assert not mentions("Founded in 18730.", "1873")
    assert not mentions("Kessiton is a city.", "Kessi")
    assert mentions("KESSI lies north.", "kessi")
    assert not mentions("anything", "  ")
