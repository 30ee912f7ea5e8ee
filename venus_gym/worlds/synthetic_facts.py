"""What the embedded research world is made of: seven entity types and their facts.

    ENTITY_TYPES["person"]        noun, share of the pages, pronoun, search-snippet leads
    FACTS["birthplace"]           subject type, relation (an entity) or attribute (a value),
                                  its keyword, statement and question templates
    FACTS_BY_TYPE["company"]      the facts a page of that type states

A fact's statement templates name the subject, carry the fact's keyword and the value; its
question templates ask for the value. Attribute values are drawn by a ValueSpec (years,
log-uniform counts, measures with a unit, or a category from a pool such as COLOURS). The
generator (venus_gym.worlds.synthetic) writes one page per entity from these and builds the
multi-hop tasks by following relations.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EntityType:
    """A kind of entity and how pages about it are introduced."""

    id: str
    noun: str
    #: Share of the world's pages; the shares of all types sum to 1.
    share: float
    #: Relative pronoun for distractor clauses ("who" for people, "which" otherwise).
    pronoun: str
    #: Leads used as search snippets and first sentences: entity type plus harmless words,
    #: never a fact value (the snippet test enforces it).
    leads: tuple[str, ...]


@dataclass(frozen=True)
class ValueSpec:
    """How an attribute's values are drawn and written.

    kind: "year" (lo..hi), "count" (log-uniform lo..hi, three significant digits),
          "measure" (lo..hi followed by `unit`), or "choice" (one of `pool`).
    """

    kind: str
    lo: int = 0
    hi: int = 0
    unit: str = ""
    pool: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fact:
    """One relation (``target`` is an entity type) or attribute (``target`` is None).

    Templates use ``{s}`` for the subject and ``{o}`` for the object or value.

    keyword:    lower-case stem that every statement contains (what a reader scans for).
    predicate:  relative-clause form, used in distractors: "was founded by {o}".
    statements: full sentences stating the fact on the subject's page; all name the subject.
    questions:  final-hop questions; ``{s}`` may be a nested noun phrase.
    clause:     indirect question for visit goals: "who founded {s}".
    phrases:    relations only: noun phrases for the object, "the founder of {s}".
    name_phrases: like `phrases`, but only grammatical when ``{s}`` is a bare name.
    inverse:    relations only: sentence on the object's page, ``{o}`` the object and
                ``{subjects}`` a list of subjects ("People born in {o} include {subjects}.").
    values:     attributes only: how values are drawn.
    """

    id: str
    subject: str
    target: str | None
    keyword: str
    predicate: str
    statements: tuple[str, ...]
    questions: tuple[str, ...]
    clause: str
    phrases: tuple[str, ...] = ()
    name_phrases: tuple[str, ...] = ()
    inverse: str = ""
    values: ValueSpec | None = None

    @property
    def is_relation(self) -> bool:
        return self.target is not None


COLOURS = ("red", "blue", "green", "amber", "violet", "crimson", "teal", "ochre",
           "silver", "indigo", "scarlet", "ivory", "maroon", "cobalt", "saffron")


INSTRUMENTS = ("oboe", "cello", "harp", "lute", "viola", "bassoon", "zither", "clarinet",
               "sitar", "marimba", "flute", "trombone")


INDUSTRIES = ("shipbuilding", "textiles", "robotics", "publishing", "brewing", "aerospace",
              "mining", "pharmaceuticals", "logistics", "software", "glassmaking",
              "agriculture")


ENTITY_TYPES: dict[str, EntityType] = {t.id: t for t in (
    EntityType("person", "person", 0.36, "who", (
        "{s} is a person profiled in the Venus World encyclopedia.",
        "This article is a biography of {s}.",
        "{s} is a figure whose life and career are described in this article.",
    )),
    EntityType("city", "city", 0.16, "which", (
        "{s} is a city described in the Venus World encyclopedia.",
        "This article covers the city of {s}, its people and its places.",
        "{s} is a city; this entry summarises what is known about it.",
    )),
    EntityType("country", "country", 0.06, "which", (
        "{s} is a country described in the Venus World encyclopedia.",
        "This article is about the country of {s}.",
        "{s} is a sovereign state; this entry gives an overview of it.",
    )),
    EntityType("company", "company", 0.16, "which", (
        "{s} is a company profiled in the Venus World encyclopedia.",
        "This article is about the company {s}.",
        "{s} is a business; this entry covers its people and places.",
    )),
    EntityType("university", "university", 0.10, "which", (
        "{s} is a university described in the Venus World encyclopedia.",
        "This article is about {s}, an institution of higher education.",
        "{s} is a university; this entry gives an overview of it.",
    )),
    EntityType("river", "river", 0.08, "which", (
        "{s} is a river described in the Venus World encyclopedia.",
        "This article is about {s}, a river.",
        "{s} is a river; this entry describes its course.",
    )),
    EntityType("mountain", "mountain", 0.08, "which", (
        "{s} is a mountain described in the Venus World encyclopedia.",
        "This article is about {s}, a mountain.",
        "{s} is a mountain; this entry describes it.",
    )),
)}


def _year(lo: int, hi: int) -> ValueSpec:
    return ValueSpec("year", lo, hi)


def _count(lo: int, hi: int) -> ValueSpec:
    return ValueSpec("count", lo, hi)


def _measure(lo: int, hi: int, unit: str) -> ValueSpec:
    return ValueSpec("measure", lo, hi, unit)


def _choice(pool: tuple[str, ...]) -> ValueSpec:
    return ValueSpec("choice", pool=pool)


_POPULATION_STATEMENTS = (
    "{s} has a population of {o}.",
    "The population of {s} is {o}.",
    "With a population of {o}, {s} is a busy place.",
)


_POPULATION_QUESTIONS = ("What is the population of {s}?", "How many people live in {s}?")


FACTS: dict[str, Fact] = {f.id: f for f in (
    # ---- person ----
    Fact("person.born_in", "person", "city", "born", "was born in {o}",
         ("{s} was born in {o}.", "{s} was born in the city of {o}.",
          "Records show that {s} was born in {o}.", "{o} is where {s} was born."),
         ("In which city was {s} born?", "What is the birthplace of {s}?",
          "Where was {s} born?"),
         "where {s} was born",
         phrases=("the city where {s} was born", "the birthplace of {s}"),
         name_phrases=("{s}'s birthplace",),
         inverse="People born in {o} include {subjects}."),
    Fact("person.works_for", "person", "company", "works", "works for {o}",
         ("{s} works for {o}.", "{s} works at {o}.",
          "Today {s} works for {o}.", "{s} works as an engineer at {o}."),
         ("Which company does {s} work for?", "Who employs {s}?",
          "What company does {s} work at?"),
         "which company {s} works for",
         phrases=("the company that employs {s}", "the employer of {s}",
                  "the company {s} works for"),
         name_phrases=("{s}'s employer",),
         inverse="Staff of {o} include {subjects}."),
    Fact("person.educated_at", "person", "university", "studied", "studied at {o}",
         ("{s} studied at {o}.", "{s} studied for a degree at {o}.",
          "After school, {s} studied at {o}."),
         ("Which university did {s} attend?", "Where did {s} study?",
          "What is the alma mater of {s}?"),
         "where {s} studied",
         phrases=("the university attended by {s}", "the university where {s} studied"),
         name_phrases=("{s}'s alma mater",),
         inverse="Alumni of {o} include {subjects}."),
    Fact("person.birth_year", "person", None, "born", "was born in {o}",
         ("{s} was born in {o}.", "{s} was born in the year {o}.",
          "Born in {o}, {s} grew up in a large family."),
         ("In what year was {s} born?", "What is the birth year of {s}?",
          "When was {s} born?"),
         "the year {s} was born", values=_year(1850, 1975)),
    Fact("person.height", "person", None, "tall", "is {o} tall",
         ("{s} is {o} tall.", "{s} stands {o} tall.",
          "At {o} tall, {s} is easy to spot in a crowd."),
         ("How tall is {s}?", "What is the height of {s} in centimetres?"),
         "how tall {s} is", values=_measure(150, 205, "cm")),
    Fact("person.instrument", "person", None, "plays", "plays the {o}",
         ("{s} plays the {o}.", "In the evenings, {s} plays the {o}.",
          "{s} is an amateur musician who plays the {o}."),
         ("Which instrument does {s} play?", "What instrument is played by {s}?"),
         "which instrument {s} plays", values=_choice(INSTRUMENTS)),
    # ---- city ----
    Fact("city.country", "city", "country", "located", "is located in {o}",
         ("{s} is located in {o}.", "{s} is a city located in {o}.",
          "The city of {s} is located in the country of {o}."),
         ("In which country is {s} located?", "Which country is {s} located in?"),
         "which country {s} is located in",
         phrases=("the country where {s} is located", "the country in which {s} is located"),
         inverse="Cities located in {o} include {subjects}."),
    Fact("city.mayor", "city", "person", "mayor", "has {o} as its mayor",
         ("The mayor of {s} is {o}.", "{o} serves as the mayor of {s}.",
          "{s} is governed by its mayor, {o}."),
         ("Who is the mayor of {s}?", "Who serves as mayor of {s}?"),
         "who the mayor of {s} is",
         phrases=("the mayor of {s}",),
         name_phrases=("{s}'s mayor",),
         inverse="{o} serves as mayor of {subjects}."),
    Fact("city.founded", "city", None, "founded", "was founded in {o}",
         ("{s} was founded in {o}.", "The city of {s} was founded in {o}.",
          "Settlers founded {s} in {o}."),
         ("In what year was {s} founded?", "When was {s} founded?"),
         "the year {s} was founded", values=_year(800, 1950)),
    Fact("city.population", "city", None, "population", "has a population of {o}",
         _POPULATION_STATEMENTS, _POPULATION_QUESTIONS, "the population of {s}",
         values=_count(2_000, 5_000_000)),
    Fact("city.elevation", "city", None, "elevation", "lies at an elevation of {o}",
         ("{s} lies at an elevation of {o}.", "The elevation of {s} is {o} above sea level.",
          "{s} sits at an elevation of {o}."),
         ("What is the elevation of {s}?", "At what elevation does {s} lie?"),
         "the elevation of {s}", values=_measure(2, 3_500, "metres")),
    # ---- country ----
    Fact("country.capital", "country", "city", "capital", "has {o} as its capital",
         ("The capital of {s} is {o}.", "{o} is the capital of {s}.",
          "{s} has its capital at {o}."),
         ("What is the capital of {s}?", "Which city is the capital of {s}?"),
         "which city is the capital of {s}",
         phrases=("the capital of {s}", "the capital city of {s}"),
         name_phrases=("{s}'s capital",),
         inverse="{o} serves as the capital of {subjects}."),
    Fact("country.president", "country", "person", "president", "is led by president {o}",
         ("The president of {s} is {o}.", "{o} serves as president of {s}.",
          "{s} is led by its president, {o}."),
         ("Who is the president of {s}?", "Who leads {s} as president?"),
         "who the president of {s} is",
         phrases=("the president of {s}",),
         name_phrases=("{s}'s president",),
         inverse="{o} is the president of {subjects}."),
    Fact("country.independence", "country", None, "independen", "became independent in {o}",
         ("{s} became independent in {o}.", "{s} gained its independence in {o}.",
          "Independence came to {s} in {o}."),
         ("In what year did {s} become independent?", "When did {s} gain independence?"),
         "the year {s} became independent", values=_year(1200, 1990)),
    Fact("country.population", "country", None, "population", "has a population of {o}",
         _POPULATION_STATEMENTS, _POPULATION_QUESTIONS, "the population of {s}",
         values=_count(200_000, 90_000_000)),
    Fact("country.flag_colour", "country", None, "flag", "has a mostly {o} flag",
         ("The flag of {s} is mostly {o}.", "{s} flies a flag that is mostly {o}.",
          "The main colour of the flag of {s} is {o}."),
         ("What is the main colour of the flag of {s}?",
          "What colour dominates the flag of {s}?"),
         "the main colour of the flag of {s}", values=_choice(COLOURS)),
    # ---- company ----
    Fact("company.founded_by", "company", "person", "founded", "was founded by {o}",
         ("{s} was founded by {o}.", "{o} founded {s}.",
          "{s} was founded by the entrepreneur {o}."),
         ("Who founded {s}?", "Who is the founder of {s}?"),
         "who founded {s}",
         phrases=("the founder of {s}", "the person who founded {s}"),
         name_phrases=("{s}'s founder",),
         inverse="{o} is known as the founder of {subjects}."),
    Fact("company.headquarters", "company", "city", "headquarter", "is headquartered in {o}",
         ("{s} is headquartered in {o}.", "The headquarters of {s} are in {o}.",
          "{s} has its headquarters in {o}."),
         ("In which city is {s} headquartered?", "Where are the headquarters of {s}?"),
         "where {s} is headquartered",
         phrases=("the city where {s} is headquartered",
                  "the city that hosts the headquarters of {s}"),
         inverse="Companies headquartered in {o} include {subjects}."),
    Fact("company.founded", "company", None, "founded", "was founded in {o}",
         ("{s} was founded in {o}.", "{s} was founded in the year {o}.",
          "Founded in {o}, {s} grew quickly."),
         ("In what year was {s} founded?", "When was {s} founded?"),
         "the year {s} was founded", values=_year(1870, 2020)),
    Fact("company.employees", "company", None, "employ", "employs {o} people",
         ("{s} employs {o} people.", "{s} has {o} employees.",
          "The workforce of {s} numbers {o} employees."),
         ("How many people does {s} employ?", "How many employees does {s} have?"),
         "how many people {s} employs", values=_count(12, 250_000)),
    Fact("company.industry", "company", None, "industry", "operates in the {o} industry",
         ("{s} operates in the {o} industry.", "{s} is a firm in the {o} industry.",
          "The {o} industry is the core business of {s}."),
         ("In which industry does {s} operate?", "What industry is {s} part of?"),
         "which industry {s} operates in", values=_choice(INDUSTRIES)),
    # ---- university ----
    Fact("university.city", "university", "city", "located", "is located in {o}",
         ("{s} is located in {o}.", "The campus of {s} is located in {o}.",
          "{s} is located in the city of {o}."),
         ("In which city is {s} located?", "Where is {s} located?"),
         "which city {s} is located in",
         phrases=("the city where {s} is located", "the home city of {s}"),
         inverse="Universities located in {o} include {subjects}."),
    Fact("university.established", "university", None, "established",
         "was established in {o}",
         ("{s} was established in {o}.", "{s} was formally established in {o}.",
          "Established in {o}, {s} is one of the older schools in the region."),
         ("In what year was {s} established?", "When was {s} established?"),
         "the year {s} was established", values=_year(1100, 1990)),
    Fact("university.students", "university", None, "student", "has {o} students",
         ("{s} has {o} students.", "About {o} students are enrolled at {s}.",
          "{s} teaches {o} students."),
         ("How many students does {s} have?", "How many students are enrolled at {s}?"),
         "how many students {s} has", values=_count(300, 80_000)),
    Fact("university.colour", "university", None, "colour", "uses {o} as its school colour",
         ("The school colour of {s} is {o}.", "{s} uses {o} as its school colour.",
          "Students of {s} wear {o}, the school colour."),
         ("What is the school colour of {s}?", "Which colour does {s} use as its school colour?"),
         "the school colour of {s}", values=_choice(COLOURS)),
    # ---- river ----
    Fact("river.flows_through", "river", "city", "flow", "flows through {o}",
         ("{s} flows through {o}.", "{s} flows through the city of {o}.",
          "On its way to the sea, {s} flows through {o}."),
         ("Which city does {s} flow through?", "Through which city does {s} flow?"),
         "which city {s} flows through",
         phrases=("the city that {s} flows through", "the city through which {s} flows"),
         inverse="Rivers that flow through {o} include {subjects}."),
    Fact("river.source", "river", "mountain", "source", "has its source on {o}",
         ("The source of {s} is on {o}.", "{s} has its source on {o}.",
          "{s} takes its source on the slopes of {o}."),
         ("On which mountain is the source of {s}?", "Where does {s} have its source?"),
         "where {s} has its source",
         phrases=("the mountain where {s} has its source", "the mountain at the source of {s}"),
         inverse="{o} is the source of {subjects}."),
    Fact("river.length", "river", None, "long", "is {o} long",
         ("{s} is {o} long.", "{s} runs {o} long from source to mouth.",
          "Measured from its source, {s} is {o} long."),
         ("How long is {s}?", "What is the length of {s} in kilometres?"),
         "how long {s} is", values=_measure(20, 4_000, "km")),
    # ---- mountain ----
    Fact("mountain.country", "mountain", "country", "located", "is located in {o}",
         ("{s} is located in {o}.", "{s} is a mountain located in {o}.",
          "{s} is located within the borders of {o}."),
         ("In which country is {s} located?", "Which country is {s} located in?"),
         "which country {s} is located in",
         phrases=("the country where {s} is located",),
         inverse="Mountains located in {o} include {subjects}."),
    Fact("mountain.first_climber", "mountain", "person", "climb", "was first climbed by {o}",
         ("{s} was first climbed by {o}.", "{o} was the first to climb {s}.",
          "The first person to climb {s} was {o}."),
         ("Who first climbed {s}?", "Who was the first person to climb {s}?"),
         "who first climbed {s}",
         phrases=("the first person to climb {s}", "the person who first climbed {s}"),
         inverse="{o} was the first to climb {subjects}."),
    Fact("mountain.height", "mountain", None, "height", "has a height of {o}",
         ("{s} has a height of {o}.", "The height of {s} is {o}.",
          "{s} rises to a height of {o}."),
         ("How high is {s}?", "What is the height of {s}?"),
         "the height of {s}", values=_measure(400, 8_800, "metres")),
    Fact("mountain.first_ascent", "mountain", None, "climb", "was first climbed in {o}",
         ("{s} was first climbed in {o}.", "The first climb of {s} took place in {o}.",
          "{s} was climbed for the first time in {o}."),
         ("In what year was {s} first climbed?", "When was {s} first climbed?"),
         "the year {s} was first climbed", values=_year(1750, 2000)),
)}


FACTS_BY_TYPE: dict[str, tuple[Fact, ...]] = {
    t: tuple(f for f in FACTS.values() if f.subject == t) for t in ENTITY_TYPES}
