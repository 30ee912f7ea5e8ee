"""A scripted agent that solves tasks by following their gold path, honestly.

The oracle knows *where* to look (each hop's page, goal and expected value from
``Task.gold_path``) but only answers what the environment actually shows it: for every
hop it searches for the hop's entity, visits the page with the hop's goal and checks that
the expected value appears in what the visit returned. If the value never shows up (after
one re-phrased visit) it answers "unknown" instead of the answer it knows. That is what
makes "the oracle solves >= 99% of tasks" a real test of the environment's tools.

Its turns are written in the DR-Venus format with seeded, varied reasoning text, so its
trajectories double as SFT data. With ``detour_prob`` or ``target_turns`` it also takes
dead ends (searching a neighbouring entity, opening a wrong page, broad searches), notes
that they did not help and returns to the plan, which gives long trajectories (100+ turns
on 4-hop tasks) for a long-turn SFT tail.

The oracle reads observations only through case-insensitive substring tests (is this url
in the text, is this value in the text), so it does not depend on how the environment
frames its tool responses. For detours it also picks links out of search results written
as ``[title](url)`` or as bare urls; when it finds none it falls back to broad searches.

Usage::

    agent = OracleAgent(task, rng_seed=0)
    observation, info = env.reset(options={"task_id": task.id})   # the question
    done = False
    while not done:
        observation, reward, terminated, truncated, info = env.step(agent.act(observation))
        done = terminated or truncated
"""

from __future__ import annotations

import random
import re
from collections.abc import Generator
from dataclasses import dataclass
from urllib.parse import unquote

from venus_gym.corpus import Task
from venus_gym.protocol import FORCED_FINAL_NOTICE, format_answer_turn, format_tool_turn

UNKNOWN_ANSWER = "unknown"
STYLES = ("varied", "plain")
#: Answers that no page states verbatim (HotpotQA comparisons); accepted once every gold
#: page has been read.
_YES_NO = ("yes", "no")
_DETOUR_CAP_PER_HOP = 3
_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://\S+)\)(?=\s|$)")
_BARE_URL = re.compile(r"https?://[^\s<>\"\]]+")
_WORD = re.compile(r"[\w'-]+")
_STOPWORDS = frozenset(
    "a an and are at by did do does find for from how in information is it many much of on "
    "or out question relevant the to was what when where which who whom whose with".split())
# Broad follow-up queries for detours: "<entity> <word>".
_BROAD_WORDS = ("overview", "history", "facts", "profile", "details", "background",
                "records", "notes")

Turn = Generator[str, str, None]


def mentions(text: str, phrase: str) -> bool:
    """Case-insensitive substring test that does not match inside a longer word or number
    ("1873" is not in "18730", "Kessi" is not in "Kessiton")."""
    if not phrase.strip():
        return False
    pattern = r"(?<![0-9a-z])" + re.escape(phrase.casefold()) + r"(?![0-9a-z])"
    return re.search(pattern, text.casefold()) is not None


@dataclass(frozen=True)
class _Hop:
    entity: str
    url: str
    goal: str
    value: str  # "" when nothing checkable is known (some real-data hops)

    @property
    def clause(self) -> str:
        """The goal as a clause: "Find who founded X" -> "who founded X"."""
        for prefix in ("Find out: ", "Find "):
            if self.goal.startswith(prefix):
                return self.goal[len(prefix):]
        return self.goal[:1].lower() + self.goal[1:]


# Reasoning templates. "plain" style always takes the first one.
_THOUGHTS: dict[str, tuple[str, ...]] = {
    "plan": (
        "The question is: {question} I'll start from {entity} and follow the facts one page "
        "at a time, reading pages rather than trusting search snippets. {steps}",
        "Let me break this down. {steps} I need to resolve the chain step by step, and each "
        "step means reading a page.",
        "I need to answer: {question} {steps} The named starting point is {entity}, so I will "
        "look it up first.",
    ),
    "plan_single": (
        "The question is: {question} {steps} This needs one fact about {entity}, which I "
        "should read on its page.",
        "{steps} Search snippets rarely state facts, so I'll locate the page for {entity} and "
        "read it.",
    ),
    "search": (
        "I'll search for {entity}.",
        "Let me search for {entity}.",
        "Searching for {entity} to find its page.",
    ),
    "next_search": (
        "{step} Next I need to find {clause}, so I'll search for {entity}.",
        "{step} Let me search for {entity}.",
        "{step} To find {clause}, I'll look up {entity}.",
    ),
    "found": (
        "The page confirms {clause}: {value}.",
        "Found it: {value} ({clause}).",
        "So {clause} is {value}.",
    ),
    "read": (
        "I have read the page on {entity}.",
        "Done with {entity}.",
    ),
    "rephrase": (
        "The results do not show a page for {entity}. Let me try a more specific query.",
        "No result links to {entity} directly; I'll rephrase the search.",
    ),
    "visit_seen": (
        "The results include the page for {entity}. I'll open it to find {clause}.",
        "There is a result for {entity}. Reading it should tell me {clause}.",
        "The snippets don't state the fact, so I need to read the {entity} page to find "
        "{clause}.",
    ),
    "visit_unseen": (
        "The search still does not list {entity}, but its page should be at {url}. I'll open "
        "it directly to find {clause}.",
        "No luck in the results. I'll go straight to {url}, which should be the page for "
        "{entity}, and look for {clause}.",
    ),
    "retry_visit": (
        "The page summary did not mention {clause}. Let me read it again with a more "
        "specific goal.",
        "Nothing about {clause} came back. I'll ask for that fact explicitly.",
    ),
    "give_up": (
        "Even the second reading did not state {clause}. Without that fact I can't verify "
        "an answer, so I'll say I don't know.",
        "I still cannot find {clause} anywhere in what I read. I won't guess.",
    ),
    "answer": (
        "Following the chain {chain}, the answer is {answer}.",
        "That answers the question: {answer}.",
        "That was the last piece. Putting it together ({chain}), the final answer is "
        "{answer}.",
    ),
    "answer_read": (
        "The pages I read state {answer}, which answers the question.",
        "Having read the supporting pages, the answer is {answer}.",
    ),
    "answer_compare": (
        "I have read every page the question depends on; comparing what they say, the answer "
        "is {answer}.",
    ),
    "forced": (
        "I have to answer now. Based on what I have verified so far, the answer is {answer}.",
    ),
    "detour_visit": (
        "{other} looks related; maybe its page says {clause}. Opening it.",
        "Let me check the page for {other}, in case it mentions {clause}.",
        "I'll take a look at {other} as well; it might help with {clause}.",
    ),
    "detour_search": (
        "{other} came up in the results; it might be connected to {entity}. Let me check it.",
        "Perhaps {other} is the one the question is about. A quick search to see.",
        "Let me see what the search returns for {other}.",
    ),
    "detour_broad": (
        "Let me try a broader search.",
        "A broad query might surface more context around {entity}.",
        "I'll widen the search a little.",
    ),
    "double_check": (
        "Before answering, let me double-check {value} with one more search.",
    ),
    "after_detour_visit": (
        "That page is about {other}, not what I need; it does not say {clause}. Going back "
        "to {entity}.",
        "{other} turned out to be irrelevant here. Back to {entity}.",
        "That was a dead end: the page on {other} does not help with {clause}.",
    ),
    "after_detour_search": (
        "Those results are not what I need for {clause}. Back to {entity}.",
        "That search did not help with {clause}; returning to the plan.",
    ),
    "after_double_check": (
        "Nothing contradicts it.",
    ),
}


class OracleAgent:
    """Scripted agent for one task; call `act` with each observation until `done`.

    Args:
        task: the task; its gold_path (or, failing that, gold_urls) is the plan.
        rng_seed: seeds every choice (wording, detours); same seed + same observations
            -> same turns.
        detour_prob: at each step, the chance of first taking a dead end (repeated: the
            number of detours per step is geometric).
        max_detours: most dead ends in the episode. None = 3 per hop, or as many as
            `target_turns` needs when that is set.
        target_turns: if set, add dead ends spread over the episode until it is about this
            many turns long (material permitting), e.g. 120 for a long-turn SFT tail.
        style: "varied" (seeded choice among reasoning templates) or "plain" (always the
            first template, one query per search).
        plan_steps: write the question's decomposition ("Step 1: ... Step 2: ...") in the
            first turn and restate each step when it starts (`_steps`). False gives the
            older wording without steps: a short SFT run learns it faster (the 450-step
            demo: experiments/HISTORY.md, part 6).

    Attributes:
        done: True once the final answer turn has been returned.
        answer: the final answer given (None before).
        turns: assistant turns produced so far.
        detours: dead ends taken so far.
    """

    def __init__(self, task: Task, rng_seed: int = 0, detour_prob: float = 0.0,
                 max_detours: int | None = None, target_turns: int | None = None,
                 style: str = "varied", plan_steps: bool = True):
        if not 0.0 <= detour_prob <= 1.0:
            raise ValueError(f"detour_prob must be in [0, 1], got {detour_prob!r}")
        if max_detours is not None and max_detours < 0:
            raise ValueError(f"max_detours must be >= 0 or None, got {max_detours!r}")
        if target_turns is not None and target_turns < 1:
            raise ValueError(f"target_turns must be >= 1 or None, got {target_turns!r}")
        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {style!r}")
        self.task = task
        self.hops = _plan(task)
        self.detour_prob = detour_prob
        self.target_turns = target_turns
        if max_detours is None:
            max_detours = target_turns if target_turns is not None \
                else _DETOUR_CAP_PER_HOP * len(self.hops)
        self.max_detours = max_detours
        self.style = style
        self.plan_steps = plan_steps
        # A string seed is hashed deterministically (unlike hash()), and mixing in the task
        # id makes different tasks word their reasoning differently under one seed.
        self.rng = random.Random(f"{rng_seed}:{task.id}")

        self.done = False
        self.answer: str | None = None
        self.turns = 0
        self.detours = 0

        self._script = self._run()
        self._started = False
        self._decision_points_left = 2 * len(self.hops) + 1  # before each search/visit/answer
        self._note = ""  # said at the start of the next turn (e.g. after a dead end)
        self._calls: set[tuple[str, frozenset[str]]] = set()
        self._reserved = {("search", frozenset([hop.entity])) for hop in self.hops} | \
            {("visit", frozenset([hop.url])) for hop in self.hops}
        self._links: dict[str, str] = {}  # url -> title, from search results, in order seen
        self._visited: set[str] = set()
        self._searched: set[str] = {hop.entity.casefold() for hop in self.hops}
        self._gold_reads: list[str] = []  # observations of gold-page visits
        self._found: list[str] = []  # values confirmed so far, one per finished hop

    # ---- public ----

    def act(self, observation: str) -> str:
        """The next assistant turn, given the environment's latest observation."""
        if self.done:
            raise RuntimeError("the oracle has already answered; create a new agent")
        if self._started and _is_forced_final(observation):
            turn = self._forced_answer()
        elif not self._started:
            self._started = True
            turn = next(self._script)  # the first observation is the question itself
        else:
            turn = self._script.send(observation)
        self.turns += 1
        return turn

    # ---- the script ----

    def _run(self) -> Turn:
        first = self.hops[0]
        # The plan opens the first turn, whether that is the first search or a dead end.
        self._note = self._say("plan" if len(self.hops) > 1 else "plan_single",
                               question=self.task.question, entity=first.entity,
                               steps=self._steps() if self.plan_steps else "")
        for i, hop in enumerate(self.hops):
            yield from self._detour_point(hop)
            key = "search" if i == 0 else "next_search"
            opening = self._say(key, entity=hop.entity, clause=hop.clause,
                                step=_step(i, hop.clause) if self.plan_steps else "")
            observation = yield self._tool("search", {"query": self._queries(hop)}, opening)
            self._remember_links(observation)
            url_seen = _has(observation, hop.url)
            if not url_seen:
                query = self._rephrased_query(hop)
                observation = yield self._tool("search", {"query": [query]},
                                               self._say("rephrase", entity=hop.entity))
                self._remember_links(observation)
                url_seen = _has(observation, hop.url)

            yield from self._detour_point(hop)
            key = "visit_seen" if url_seen else "visit_unseen"
            think = self._say(key, entity=hop.entity, clause=hop.clause, url=hop.url)
            observation = yield self._visit(hop.url, hop.goal, think)
            if hop.value and not mentions(observation, hop.value):
                # Different words, same target: a second chance for a summarizer that
                # matched the first wording poorly.
                alternative = f"Quote what the page says about {hop.clause}"
                observation = yield self._visit(hop.url, alternative,
                                                self._say("retry_visit", clause=hop.clause))
            self._gold_reads.append(observation)
            if hop.value and not mentions(observation, hop.value):
                yield self._final(self._say("give_up", clause=hop.clause), UNKNOWN_ANSWER)
                return
            self._found.append(hop.value)
            # Said in the next turn, before any dead end that may come first.
            self._note = self._say("found", clause=hop.clause, value=hop.value) if hop.value \
                else self._say("read", entity=hop.entity)

        last = self.hops[-1]
        yield from self._detour_point(last, final=True)
        yield self._final(*self._conclusion())

    def _steps(self) -> str:
        """The question decomposed, written before anything is read: "Step 1: who the mayor
        of X is. Step 2: which instrument #1 plays." A later hop's entity is what an earlier
        step finds, unknown yet, so it is written as that step's number. Each later search
        turn restates its step with the entity filled in ("Step 2: which instrument Grethal
        Stanlin plays."), so the relation it needs is copied from the plan a few hundred
        tokens back rather than re-derived from the question's wording (a tiny model trained
        without this picked the right first relation on 5 of 46 held-out tasks;
        experiments/HISTORY.md, part 5)."""
        steps = []
        for i, hop in enumerate(self.hops):
            clause = hop.clause
            if i and hop.entity:
                clause = clause.replace(hop.entity, f"#{i}")
            steps.append(_step(i, clause))
        return " ".join(steps)

    def _conclusion(self) -> tuple[str, str]:
        """(reasoning, answer) once every hop is read: the answer only if it was seen."""
        answer, last = self.task.answers[0], self.hops[-1]
        if last.value:
            chain = " -> ".join([self.hops[0].entity, *(v for v in self._found if v)])
            return self._say("answer", chain=chain, answer=answer), answer
        if any(mentions(read, a) for read in self._gold_reads for a in self.task.answers):
            return self._say("answer_read", answer=answer), answer
        if answer.strip().casefold() in _YES_NO:
            return self._say("answer_compare", answer=answer), answer
        return self._say("give_up", clause="the answer"), UNKNOWN_ANSWER

    def _forced_answer(self) -> str:
        """The environment demands an answer now: give it only if it was verified."""
        self._script.close()
        answer = UNKNOWN_ANSWER
        if len(self._found) == len(self.hops):
            answer = self._conclusion()[1]
        return self._final(self._say("forced", answer=answer), answer)

    # ---- detours ----

    def _detour_point(self, hop: _Hop, final: bool = False) -> Turn:
        """Maybe take some dead ends before the next planned action."""
        remaining = self._decision_points_left
        self._decision_points_left -= 1
        budget = self.max_detours - self.detours
        count = 0
        while count < budget and self.detour_prob and self.rng.random() < self.detour_prob:
            count += 1
        if self.target_turns is not None:
            # Spread the missing turns evenly over the decision points still ahead.
            deficit = self.target_turns - (self.turns + remaining)
            if deficit > 0:
                extra = int(self.rng.random() < (deficit % remaining) / remaining)
                count = max(count, deficit // remaining + extra)
        for _ in range(min(count, budget)):
            made = yield from self._one_detour(hop, final)
            if not made:
                break

    def _one_detour(self, hop: _Hop, final: bool) -> Generator[str, str, bool]:
        options = []
        unvisited = [u for u in self._links if u not in self._visited
                     and ("visit", frozenset([u])) not in self._reserved]
        if unvisited:
            options += ["visit", "visit"]
        titles = [t for t in dict.fromkeys(self._links.values())
                  if t.casefold() not in self._searched and self._fresh("search", [t])]
        if titles:
            options.append("search")
        broad = [q for q in self._broad_queries(hop) if self._fresh("search", [q])]
        if broad:
            options.append("broad")
        if final and hop.value and self._fresh("search", [hop.value]):
            options = ["double_check"]
        if not options:
            return False
        kind = self.rng.choice(options)
        if kind == "visit":
            url = self.rng.choice(unvisited[:10])
            other = self._links[url]
            think = self._say("detour_visit", other=other, clause=hop.clause, entity=hop.entity)
            yield self._visit(url, hop.goal, think)
            self._note = self._say("after_detour_visit", other=other, clause=hop.clause,
                                   entity=hop.entity)
        elif kind == "search":
            other = self.rng.choice(titles[:10])
            self._searched.add(other.casefold())
            think = self._say("detour_search", other=other, entity=hop.entity)
            self._remember_links((yield self._tool("search", {"query": [other]}, think)))
            self._note = self._say("after_detour_search", clause=hop.clause, entity=hop.entity)
        elif kind == "broad":
            think = self._say("detour_broad", entity=hop.entity)
            self._remember_links((yield self._tool("search", {"query": [broad[0]]}, think)))
            self._note = self._say("after_detour_search", clause=hop.clause, entity=hop.entity)
        else:
            think = self._say("double_check", value=hop.value)
            yield self._tool("search", {"query": [hop.value]}, think)
            self._note = self._say("after_double_check")
        self.detours += 1
        return True

    def _broad_queries(self, hop: _Hop) -> list[str]:
        question = self.task.question.strip().rstrip("?")
        return [question, *(f"{hop.entity} {word}" for word in _BROAD_WORDS)]

    # ---- writing turns ----

    def _say(self, key: str, **fields: str) -> str:
        templates = _THOUGHTS[key]
        template = templates[0] if self.style == "plain" else self.rng.choice(templates)
        # An empty field (a plan step when plan_steps is off) leaves no double space.
        return " ".join(template.format(**fields).split())

    def _queries(self, hop: _Hop) -> list[str]:
        queries = [hop.entity]
        focused = self._rephrased_query(hop)
        # Sometimes two queries at once, as DR-Venus agents do; the second adds the goal.
        if self.style == "varied" and focused != hop.entity and self.rng.random() < 0.3:
            queries.append(focused)
        return queries

    def _rephrased_query(self, hop: _Hop) -> str:
        entity_words = {w.casefold() for w in _WORD.findall(hop.entity)}
        keywords = [w for w in _WORD.findall(hop.clause)
                    if w.casefold() not in _STOPWORDS and w.casefold() not in entity_words]
        if keywords:
            return f"{hop.entity} {' '.join(keywords[:6])}"
        return f'"{hop.entity}"'

    def _tool(self, name: str, arguments: dict, think: str) -> str:
        items = arguments.get("query") or arguments.get("url")
        self._calls.add((name, frozenset(items)))
        return format_tool_turn(self._with_note(think), name, arguments)

    def _visit(self, url: str, goal: str, think: str) -> str:
        self._visited.add(url)
        return self._tool("visit", {"url": [url], "goal": goal}, think)

    def _final(self, think: str, answer: str) -> str:
        self.done = True
        self.answer = answer
        return format_answer_turn(self._with_note(think), answer)

    def _with_note(self, think: str) -> str:
        note, self._note = self._note, ""
        return f"{note} {think}" if note else think

    def _fresh(self, name: str, items: list[str]) -> bool:
        key = (name, frozenset(items))
        return key not in self._calls and key not in self._reserved

    def _remember_links(self, observation: str) -> None:
        found = [(m.group(2), m.group(1)) for m in _LINK.finditer(observation)]
        if not found:
            found = [(url, _title_from_url(url)) for url in
                     map(_trim_url, _BARE_URL.findall(observation))]
        for url, title in found:
            self._links.setdefault(url, title.strip())


def _step(index: int, clause: str) -> str:
    """One step of the plan as the oracle writes it, in the plan and when it starts the step."""
    return f"Step {index + 1}: {clause}."


def _plan(task: Task) -> list[_Hop]:
    """Hops from the gold path, or from bare gold urls (then nothing is checkable)."""
    hops = []
    for step in task.gold_path:
        url = str(step.get("url", ""))
        entity = str(step.get("entity") or _title_from_url(url))
        goal = str(step.get("goal") or f"Find information about {entity}")
        hops.append(_Hop(entity, url, goal, str(step.get("value") or "")))
    if not hops:
        goal = f"Find information relevant to the question: {task.question.strip()}"
        hops = [_Hop(_title_from_url(u), u, goal, "") for u in task.gold_urls]
    if not hops or not all(h.url and h.entity for h in hops):
        raise ValueError(f"task {task.id!r} has no usable gold_path or gold_urls to follow")
    return hops


def _title_from_url(url: str) -> str:
    tail = url.rstrip("/").rsplit("/", 1)[-1].split("#", 1)[0]
    return unquote(tail).replace("_", " ")


def _trim_url(url: str) -> str:
    """Drop punctuation that ends the sentence around a bare url, keeping a closing
    parenthesis that belongs to it ("https://en.wikipedia.org/wiki/Foo_(film)")."""
    url = url.rstrip(".,;:")
    if url.endswith(")") and url.count(")") > url.count("("):
        url = url[:-1]
    return url


def _has(observation: str, url: str) -> bool:
    return url.casefold() in observation.casefold()


def _is_forced_final(observation: str) -> bool:
    """The budget notice: ours verbatim, or any wording of it outside a tool response (a
    page may well contain "reached the maximum")."""
    text = observation.strip().casefold()
    if FORCED_FINAL_NOTICE.casefold() in text:
        return True
    return not text.startswith("<tool_response>") and "reached the maximum" in text \
        and "answer" in text

