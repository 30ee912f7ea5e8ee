"""The embedded research world: a seeded, procedurally generated encyclopedia with
multi-hop questions about it.

Why generate instead of shipping a corpus: the world must work offline on a fresh machine,
scale from a 100-page smoke test to 100,000 pages, and ask questions no pre-trained model
can answer from memory. Every name is built from random syllables, so the only way to an
answer is search -> read -> follow the next entity -> read again.

The world has seven entity types (person, city, country, company, university, river,
mountain). Each type has *facts*: relations to other entities (a person is born in a city,
a company is founded by a person, ...) and attributes (years, counts, measures, categories).
Every entity gets one page whose text states each of its facts in a sentence that names
the entity, carries the fact's keyword (``FACTS[fact_id].keyword``) and the value, in one
of several templates. Pages also carry

* *inverse mentions* ("People born in Kessiton include ..."), which link pages both ways;
* *distractors*: true facts about other entities of the same type, often the one whose
  number is closest ("Not to be confused with Lomar Labs, which was founded in 1874."),
  so a reader who skims for the keyword alone picks the wrong value.

Search snippets are generic leads ("Kessimor Labs is a company profiled in ...") that never
state a relation or attribute value, so search results alone never answer a question.

A k-hop task follows k-1 relations from a named start entity and asks for a fact of the
entity it reaches, e.g. (3 hops) "In what year was the university attended by the founder
of Kessimor Labs established?". Its ``gold_path`` lists, per hop, the page to read, the
fact, a visit goal ("Find who founded Kessimor Labs") and the value found there.

Generation is pure Python with one ``random.Random(seed)``: the same config always gives
byte-identical JSONL, and 100,000 pages take well under ten seconds on one core.
"""

from __future__ import annotations

import gc
import math
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TypeVar

from venus_gym.corpus import Corpus, Page, Task, World
from venus_gym.worlds.synthetic_facts import (
    COLOURS,
    ENTITY_TYPES,
    FACTS,
    FACTS_BY_TYPE,
    INDUSTRIES,
    INSTRUMENTS,
    EntityType,
    ValueSpec,
)

GENERATOR = "venus_gym.worlds.synthetic"
#: Bumped whenever the same seed would produce a different world.
GENERATOR_VERSION = 1
MIN_PAGES = 100
MAX_PAGES = 100_000
MAX_HOPS = 4
URL_PREFIX = "https://venus.world/wiki/"
TASK_SOURCE = "venus-synthetic"

_T = TypeVar("_T")


# --------------------------------------------------------------------------------------
# Sentences and names (the entity types and facts: venus_gym.worlds.synthetic_facts)
# --------------------------------------------------------------------------------------

# Distractor sentences: a true fact about another entity of the same type. None of them
# names the page's own entity, so a sentence that names it is always about it.
_DISTRACTORS = (
    "Not to be confused with {q}, {pronoun} {pred}.",
    "By comparison, {q} {pred}.",
    "Another {noun}, {q}, {pred}.",
    "Readers often mix it up with {q}, {pronoun} {pred}.",
)

# Names: every entity has one *distinctive word* (a surname, a city name, a company
# stem...) that no other entity shares, and none equals a category value, so one name can
# never be mistaken for a word of another name or for an answer.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "kr", "st", "th", "sh", "tr", "gr", "vr", "ch", "h", "j")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou", "ae", "ia")
_CODAS = ("", "", "", "", "", "n", "r", "l", "s", "th", "m", "k", "nd")
_CITY_SUFFIXES = ("", "", "", "ton", "ford", "holm", "vik", "grad", "dale", "mere")
_COUNTRY_SUFFIXES = ("ia", "land", "stan", "ary", "ora", "")
# No suffix may share a word stem with a fact keyword ("Foundry" ~ "founded", "Works" ~
# "works for"): a word on every sentence of a page would drown the keyword for readers and
# goal-focused summarizers that match word stems.
_COMPANY_SUFFIXES = ("Labs", "Holdings", "Systems", "Dynamics", "Group", "Trading", "Motors",
                     "Partners", "Ventures", "Collective")
_UNIVERSITY_FORMS = ("University of {w}", "{w} University", "{w} Institute of Technology",
                     "{w} College")
_RIVER_FORMS = ("{w} River", "River {w}")
_MOUNTAIN_FORMS = ("Mount {w}", "{w} Peak")
# Names never start like a fact keyword (see _COMPANY_SUFFIXES); four letters cover the
# five-letter stems that stemming summarizers compare.
_KEYWORD_PREFIXES = tuple(sorted({f.keyword[:4] for f in FACTS.values()}))
_N_FIRST_NAMES = 400
_INVERSE_CAP = 3  # subjects listed per inverse mention; keeps hub pages readable
_FINAL_ATTRIBUTE_SHARE = 0.65  # share of tasks whose answer is an attribute value


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------

def _opt(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class WorldConfig:
    """Everything that determines a generated world (same config -> same bytes)."""

    n_pages: int = _opt(2000, f"Pages (= entities) in the world, {MIN_PAGES}..{MAX_PAGES:,}.")
    seed: int = _opt(0, "Seed of the generator; the only source of randomness.")
    n_tasks: int | None = _opt(None, "Questions to generate, split evenly over `hops`. "
                               "None = max(n_pages // 4, 50 per hop count).")
    hops: tuple[int, ...] = _opt((1, 2, 3, 4), "Hop counts to generate (each 1..4).")
    distractors_per_page: int = _opt(2, "Distractor sentences (true facts about other "
                                     "entities of the same type) per page, 0..6. Up to 4 "
                                     "keep every task solvable through the default 3-sentence "
                                     "extractive summarizer; at 6 about 1% are not.")

    def __post_init__(self) -> None:
        if isinstance(self.n_pages, bool) or not isinstance(self.n_pages, int) \
                or not MIN_PAGES <= self.n_pages <= MAX_PAGES:
            raise ValueError(f"n_pages must be an integer in {MIN_PAGES}..{MAX_PAGES:,}, "
                             f"got {self.n_pages!r}")
        hops = tuple(self.hops)
        if not hops or any(isinstance(h, bool) or not isinstance(h, int)
                           or not 1 <= h <= MAX_HOPS for h in hops):
            raise ValueError(f"hops must be a non-empty collection of integers in 1..{MAX_HOPS}, "
                             f"got {self.hops!r}")
        object.__setattr__(self, "hops", tuple(sorted(set(hops))))
        if self.n_tasks is not None and (not isinstance(self.n_tasks, int) or self.n_tasks < 1):
            raise ValueError(f"n_tasks must be a positive integer or None, got {self.n_tasks!r}")
        if not isinstance(self.distractors_per_page, int) or \
                not 0 <= self.distractors_per_page <= 6:
            raise ValueError("distractors_per_page must be an integer in 0..6, "
                             f"got {self.distractors_per_page!r}")

    @property
    def task_count(self) -> int:
        if self.n_tasks is not None:
            return self.n_tasks
        return max(self.n_pages // 4, 50 * len(self.hops))

    @classmethod
    def help(cls) -> str:
        """One line per field: name, default and what it does."""
        return "\n".join(f"{f.name} (default {f.default!r}): {f.metadata['help']}"
                         for f in fields(cls))


def generate_world(n_pages: int = 2000, seed: int = 0, n_tasks: int | None = None,
                   hops: Sequence[int] = (1, 2, 3, 4), distractors_per_page: int = 2
                   ) -> World:
    """Generate the embedded research world (see the module docstring).

    Raises ValueError for out-of-range settings (e.g. n_pages outside 100..100,000).
    """
    config = WorldConfig(n_pages=n_pages, seed=seed, n_tasks=n_tasks, hops=tuple(hops),
                         distractors_per_page=distractors_per_page)
    with _gc_paused():
        return _WorldBuilder(config).build()


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Building allocates millions of small objects and no reference cycles, so the cyclic
    collector's passes over them are pure overhead (a quarter of the build time at 100k)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# --------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------

@dataclass
class _AttributeValue:
    text: str          # as written on the page, e.g. "2,345 metres"
    aliases: tuple[str, ...]  # further accepted answers, e.g. ("2345 metres", "2345")
    number: float      # for finding near-miss distractors; 0 for categories


class _WorldBuilder:
    """Holds the entity tables while one world is built; used once."""

    def __init__(self, config: WorldConfig):
        self.config = config
        self.rng = random.Random(config.seed)
        self._random = self.rng.random
        self.names: list[str] = []
        self.type_of: list[str] = []
        self.ids_by_type: dict[str, list[int]] = {}
        # Relation fact id -> {subject entity id: target entity id}.
        self.relation: dict[str, dict[int, int]] = {}
        self.attribute: dict[str, dict[int, _AttributeValue]] = {}
        # Fact id -> {subject id: the value as written on pages}, for relations and
        # attributes alike (looked up for every sentence, so computed once).
        self.value_text: dict[str, dict[int, str]] = {}
        # Attribute fact id -> subject ids sorted by value, and each id's rank in it.
        self.sorted_by_value: dict[str, list[int]] = {}
        self.rank: dict[str, dict[int, int]] = {}
        # Object id -> {relation fact id: up to _INVERSE_CAP subject ids}, for inverse
        # mentions on the object's page.
        self.inverse: dict[int, dict[str, list[int]]] = {}

    def build(self) -> World:
        self._make_entities()
        self._make_relations()
        self._make_attributes()
        pages = [self._page(e) for e in range(len(self.names))]
        tasks = self._make_tasks()
        c = self.config
        meta = {"generator": GENERATOR, "version": GENERATOR_VERSION, "seed": c.seed,
                "size": c.n_pages, "hops": list(c.hops),
                "distractors_per_page": c.distractors_per_page}
        return World(name=f"synthetic-{c.n_pages}-s{c.seed}", corpus=Corpus(pages),
                     tasks=tasks, meta=meta)

    # ---- entities ----

    def _type_counts(self) -> dict[str, int]:
        n = self.config.n_pages
        counts = {t.id: max(1, int(n * t.share)) for t in ENTITY_TYPES.values()}
        counts["person"] += n - sum(counts.values())  # rounding remainder
        return counts

    def _pick(self, options: Sequence[_T]) -> _T:
        # rng.choice costs ~2 us; generation makes millions of picks, so index directly.
        return options[int(self._random() * len(options))]

    def _between(self, lo: int, hi: int) -> int:
        """Uniform integer in lo..hi (inclusive), the cheap way (see `_pick`)."""
        return lo + int(self._random() * (hi - lo + 1))

    def _shuffle(self, items: list) -> None:
        """Fisher-Yates with `_random`; `rng.shuffle` is several times slower."""
        for i in range(len(items) - 1, 0, -1):
            j = int(self._random() * (i + 1))
            items[i], items[j] = items[j], items[i]

    def _draw(self, spec: ValueSpec) -> int:
        """A raw attribute value: a pool index for categories, else the number."""
        if spec.kind == "choice":
            return int(self._random() * len(spec.pool))
        if spec.kind == "count":
            raw = math.exp(math.log(spec.lo) + self._random() * math.log(spec.hi / spec.lo))
            digits = max(0, int(math.log10(raw)) - 2)  # keep three significant digits
            return int(round(raw, -digits))
        return self._between(spec.lo, spec.hi)

    def _word(self, used: set[str], n_syllables: int) -> str:
        onsets, vowels, codas = _ONSETS, _VOWELS, _CODAS
        while True:
            word = "".join(self._pick(onsets) + self._pick(vowels) + self._pick(codas)
                           for _ in range(n_syllables)).capitalize()
            if word not in used and not word.lower().startswith(_KEYWORD_PREFIXES):
                return word

    def _make_entities(self) -> None:
        rng = self.rng
        used = {w.capitalize() for w in COLOURS + INSTRUMENTS + INDUSTRIES}
        used.update(_COMPANY_SUFFIXES)
        used.update(("University", "Institute", "Technology", "College", "River", "Mount",
                     "Peak", "Venus", "World"))
        first_names = []
        for _ in range(_N_FIRST_NAMES):
            first_names.append(self._word(used, 2))
            used.add(first_names[-1])

        for type_id, count in self._type_counts().items():
            ids = self.ids_by_type[type_id] = []
            for _ in range(count):
                while True:
                    word = self._word(used, 2 if rng.random() < 0.85 else 3)
                    if type_id == "city":
                        word = _join_suffix(word, self._pick(_CITY_SUFFIXES))
                    elif type_id == "country":
                        word = _join_suffix(word, self._pick(_COUNTRY_SUFFIXES))
                    if word not in used:
                        break
                used.add(word)
                if type_id == "person":
                    name = f"{self._pick(first_names)} {word}"
                elif type_id == "company":
                    name = f"{word} {self._pick(_COMPANY_SUFFIXES)}"
                elif type_id == "university":
                    name = self._pick(_UNIVERSITY_FORMS).format(w=word)
                elif type_id == "river":
                    name = self._pick(_RIVER_FORMS).format(w=word)
                elif type_id == "mountain":
                    name = self._pick(_MOUNTAIN_FORMS).format(w=word)
                else:
                    name = word
                ids.append(len(self.names))
                self.names.append(name)
                self.type_of.append(type_id)

    # ---- relations ----

    def _make_relations(self) -> None:
        ids = self.ids_by_type
        cities, countries = ids["city"], ids["country"]
        # Every country gets at least one city first, so each has a capital inside it.
        city_country = {}
        for i, city in enumerate(cities):
            city_country[city] = countries[i] if i < len(countries) else self._pick(countries)
        capital = {}
        for city in cities:
            capital.setdefault(city_country[city], city)
        self.relation["city.country"] = city_country
        self.relation["country.capital"] = capital
        for fact in FACTS.values():
            if fact.is_relation and fact.id not in self.relation:
                targets = ids[fact.target]
                self.relation[fact.id] = {s: self._pick(targets) for s in ids[fact.subject]}
        names = self.names
        for fact_id, mapping in self.relation.items():
            self.value_text[fact_id] = {s: names[o] for s, o in mapping.items()}
            for subject, obj in mapping.items():
                subjects = self.inverse.setdefault(obj, {}).setdefault(fact_id, [])
                if len(subjects) < _INVERSE_CAP:
                    subjects.append(subject)

    # ---- attributes ----

    def _make_attributes(self) -> None:
        birth = {}
        for fact in FACTS.values():
            if fact.is_relation:
                continue
            spec = fact.values
            values = self.attribute[fact.id] = {}
            for s in self.ids_by_type[fact.subject]:
                if fact.id == "company.founded":  # founded when the founder was an adult
                    number = birth[self.relation["company.founded_by"][s]] + self._between(20, 45)
                elif fact.id == "mountain.first_ascent":
                    number = birth[self.relation["mountain.first_climber"][s]] + \
                        self._between(18, 45)
                else:
                    number = self._draw(spec)
                values[s] = _render(spec, number)
                if fact.id == "person.birth_year":
                    birth[s] = number
            self.value_text[fact.id] = {s: v.text for s, v in values.items()}
            if spec.kind != "choice":
                order = sorted(values, key=lambda s: (values[s].number, s))
                self.sorted_by_value[fact.id] = order
                self.rank[fact.id] = {s: r for r, s in enumerate(order)}

    # ---- pages ----

    def _page(self, e: int) -> Page:
        name = self.names[e]
        etype = ENTITY_TYPES[self.type_of[e]]
        lead = self._pick(etype.leads).format(s=name)
        value_text, pick = self.value_text, self._pick
        sentences = [pick(f.statements).format(s=name, o=value_text[f.id][e])
                     for f in FACTS_BY_TYPE[etype.id]]
        for fact_id, subjects in self.inverse.get(e, {}).items():
            listed = _join_names([self.names[s] for s in subjects])
            sentences.append(FACTS[fact_id].inverse.format(o=name, subjects=listed))
        self._shuffle(sentences)
        for _ in range(self.config.distractors_per_page):
            position = int(self._random() * (len(sentences) + 1))
            sentences.insert(position, self._distractor(e, etype))
        # Two paragraphs read more like an article and give summarizers some structure.
        half = (len(sentences) + 1) // 2
        text = " ".join([lead, *sentences[:half]]) + "\n\n" + " ".join(sentences[half:])
        return Page(url=URL_PREFIX + name.replace(" ", "_"), title=name, text=text,
                    snippet=lead)

    def _distractor(self, e: int, etype: EntityType) -> str:
        fact = self._pick(FACTS_BY_TYPE[etype.id])
        same_type = self.ids_by_type[etype.id]
        if fact.id in self.rank:
            # Near miss: the nearest entity by value whose value is not the same.
            order, r = self.sorted_by_value[fact.id], self.rank[fact.id][e]
            texts = self.value_text[fact.id]
            neighbours = [order[i] for i in (r + 1, r - 1, r + 2, r - 2) if 0 <= i < len(order)]
            other = next((n for n in neighbours if texts[n] != texts[e]), neighbours[0])
        else:
            other = e
            while other == e:
                other = self._pick(same_type)
        pred = fact.predicate.format(o=self.value_text[fact.id][other])
        return self._pick(_DISTRACTORS).format(q=self.names[other], pronoun=etype.pronoun,
                                               pred=pred, noun=etype.noun)

    # ---- tasks ----

    def _make_tasks(self) -> list[Task]:
        hops = self.config.hops
        total = self.config.task_count
        per_hop = {h: total // len(hops) + (1 if i < total % len(hops) else 0)
                   for i, h in enumerate(hops)}
        tasks: list[Task] = []
        seen: set[tuple] = set()
        for h in hops:
            made, attempts = 0, 0
            # Tiny worlds can run out of distinct chains; stop instead of looping forever.
            while made < per_hop[h] and attempts < 50 * per_hop[h] + 1000:
                attempts += 1
                chain = self._sample_chain(h)
                if chain is None or chain in seen:
                    continue
                seen.add(chain)
                tasks.append(self._task(f"venus-s{self.config.seed}-{h}h-{made:05d}", chain))
                made += 1
        return tasks

    def _sample_chain(self, n_hops: int) -> tuple | None:
        """(start entity, fact ids...) for a walk of `n_hops` pages, or None on a dead end."""
        rng = self.rng
        start_type = rng.choice(list(ENTITY_TYPES))
        start = rng.choice(self.ids_by_type[start_type])
        visited, current, fact_ids = {start}, start, []
        for step in range(n_hops):
            facts = FACTS_BY_TYPE[self.type_of[current]]
            final = step == n_hops - 1
            if final and rng.random() < _FINAL_ATTRIBUTE_SHARE:
                candidates = [f for f in facts if not f.is_relation]
            else:
                candidates = [f for f in facts if f.is_relation
                              and self.relation[f.id][current] not in visited]
            if not candidates:
                return None
            fact = rng.choice(candidates)
            fact_ids.append(fact.id)
            if fact.is_relation:
                current = self.relation[fact.id][current]
                visited.add(current)
        return (start, *fact_ids)

    def _task(self, task_id: str, chain: tuple) -> Task:
        rng = self.rng
        start, fact_ids = chain[0], chain[1:]
        entity, phrase, gold_path = start, self.names[start], []
        for i, fact_id in enumerate(fact_ids):
            fact = FACTS[fact_id]
            name = self.names[entity]
            value = self.value_text[fact_id][entity]
            gold_path.append({"entity": name, "url": URL_PREFIX + name.replace(" ", "_"),
                              "relation": fact_id, "goal": "Find " + fact.clause.format(s=name),
                              "value": value})
            if i < len(fact_ids) - 1:
                options = fact.phrases + (fact.name_phrases if entity == start else ())
                template = rng.choice(options)
                if phrase.endswith("s"):  # "Badruk Motors' founder", not "Motors's"
                    template = template.replace("{s}'s", "{s}'")
                phrase = template.format(s=phrase)
                entity = self.relation[fact_id][entity]
        last = FACTS[fact_ids[-1]]
        question = rng.choice(last.questions).format(s=phrase)
        question = question[0].upper() + question[1:]
        if last.is_relation:
            answers = (gold_path[-1]["value"],)
            answer_type = last.target
        else:
            attribute = self.attribute[last.id][entity]
            answers = (attribute.text, *attribute.aliases)
            answer_type = last.values.kind
        return Task(id=task_id, question=question, answers=answers, hops=len(gold_path),
                    gold_urls=tuple(h["url"] for h in gold_path), gold_path=tuple(gold_path),
                    source=TASK_SOURCE,
                    meta={"chain": list(fact_ids), "start_type": self.type_of[start],
                          "answer_type": answer_type})


def _join_suffix(word: str, suffix: str) -> str:
    """Attach a place-name suffix without doubling vowels ("Kessi" + "ia" -> "Kessia")."""
    if suffix and word[-1] in "aeiou" and suffix[0] in "aeiou":
        word = word[:-1]
    return word + suffix


def _join_names(names: list[str]) -> str:
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


def _render(spec: ValueSpec, number: int) -> _AttributeValue:
    if spec.kind == "choice":
        return _AttributeValue(spec.pool[number], (), 0)
    if spec.kind == "year":
        return _AttributeValue(str(number), (), number)
    grouped, plain = f"{number:,}", str(number)
    if spec.kind == "count":
        return _AttributeValue(grouped, (plain,) if plain != grouped else (), number)
    text = f"{grouped} {spec.unit}"
    aliases = dict.fromkeys((f"{plain} {spec.unit}", grouped, plain))  # ordered, unique
    aliases.pop(text, None)
    return _AttributeValue(text, tuple(aliases), number)
