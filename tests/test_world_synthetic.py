"""The embedded synthetic world: determinism, size bounds, well-formed tasks whose facts
are stated on the pages, and search snippets that never give answers away."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from venus_gym.corpus import World
from venus_gym.worlds import load_world
from venus_gym.worlds.oracle import mentions
from venus_gym.worlds.synthetic import MAX_PAGES, MIN_PAGES, WorldConfig, generate_world
from venus_gym.worlds.synthetic_facts import COLOURS, FACTS, INDUSTRIES, INSTRUMENTS

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@pytest.fixture(scope="module")
def world() -> World:
    return generate_world(n_pages=600, seed=3)


def _bytes(world: World, directory) -> tuple[bytes, bytes]:
    world.save(directory)
    return (directory / "corpus.jsonl").read_bytes(), (directory / "tasks.jsonl").read_bytes()


def test_same_seed_gives_byte_identical_world(tmp_path):
    first = _bytes(generate_world(n_pages=300, seed=7), tmp_path / "a")
    second = _bytes(generate_world(n_pages=300, seed=7), tmp_path / "b")
    assert first == second


def test_different_seed_gives_different_world(tmp_path):
    a = generate_world(n_pages=300, seed=7)
    b = generate_world(n_pages=300, seed=8)
    assert _bytes(a, tmp_path / "a") != _bytes(b, tmp_path / "b")
    assert {p.title for p in a.corpus} != {p.title for p in b.corpus}


@pytest.mark.parametrize("n_pages", [MIN_PAGES, 257, 1000])
def test_page_count_matches_the_size_knob(n_pages):
    assert len(generate_world(n_pages=n_pages, seed=1).corpus) == n_pages


@pytest.mark.parametrize("bad", [MIN_PAGES - 1, MAX_PAGES + 1, 0, -5, 1500.0, "2000", True])
def test_size_outside_bounds_is_rejected_with_a_clear_message(bad):
    with pytest.raises(ValueError, match="n_pages must be an integer in 100..100,000"):
        generate_world(n_pages=bad)


@pytest.mark.parametrize("kwargs", [{"hops": ()}, {"hops": (0, 1)}, {"hops": (5,)},
                                    {"n_tasks": 0}, {"distractors_per_page": 7}])
def test_other_bad_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        generate_world(n_pages=200, **kwargs)


def test_config_help_documents_every_field():
    text = WorldConfig.help()
    for name in ("n_pages", "seed", "n_tasks", "hops", "distractors_per_page"):
        assert f"{name} (default" in text


def test_urls_and_titles_are_unique_and_pages_non_empty(world):
    urls = [p.url for p in world.corpus]
    titles = [p.title for p in world.corpus]
    assert len(set(urls)) == len(urls)
    assert len(set(titles)) == len(titles)
    for page in world.corpus:
        assert page.url == "https://venus.world/wiki/" + page.title.replace(" ", "_")
        assert page.text.startswith(page.snippet)
        assert len(_SENTENCE_END.split(page.text)) >= 5


def test_default_task_count_is_balanced_over_hop_counts(world):
    counts = Counter(t.hops for t in world.tasks)
    assert sorted(counts) == [1, 2, 3, 4]
    assert len(world.tasks) == max(600 // 4, 200)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert len({t.id for t in world.tasks}) == len(world.tasks)
    assert len({t.question for t in world.tasks}) == len(world.tasks)


def test_smallest_world_still_has_50_tasks_per_hop_count():
    counts = Counter(t.hops for t in generate_world(n_pages=MIN_PAGES, seed=0).tasks)
    assert counts == {1: 50, 2: 50, 3: 50, 4: 50}


def test_hops_and_n_tasks_knobs():
    w = generate_world(n_pages=400, seed=2, n_tasks=30, hops=(2, 4))
    assert Counter(t.hops for t in w.tasks) == {2: 15, 4: 15}


def test_every_statement_and_goal_carries_its_fact_keyword():
    # What makes a hop's fact findable by a goal-focused reader: the goal and the sentence
    # share the keyword.
    for fact in FACTS.values():
        assert fact.keyword in fact.clause.lower(), fact.id
        for template in fact.statements:
            assert fact.keyword in template.lower(), (fact.id, template)
            assert "{s}" in template and "{o}" in template, (fact.id, template)


def test_gold_paths_are_chains_of_facts_stated_on_their_pages(world):
    for task in world.tasks:
        assert task.hops == len(task.gold_path) == len(task.gold_urls)
        assert task.gold_urls == tuple(h["url"] for h in task.gold_path)
        for i, hop in enumerate(task.gold_path):
            page = world.corpus.get(hop["url"])
            assert page is not None and page.title == hop["entity"]
            keyword = FACTS[hop["relation"]].keyword
            assert hop["goal"].startswith("Find ") and hop["entity"] in hop["goal"]
            # The fact: one sentence naming the entity, the keyword and the value.
            assert any(keyword in s.lower() and mentions(s, hop["value"])
                       and hop["entity"] in s for s in _SENTENCE_END.split(page.text)), \
                (task.id, i, hop)
            if i + 1 < task.hops:
                assert hop["value"] == task.gold_path[i + 1]["entity"]
        assert task.gold_path[-1]["value"] == task.answers[0]


def test_questions_name_the_start_but_no_later_entity_or_answer(world):
    for task in world.tasks:
        path = task.gold_path
        assert path[0]["entity"] in task.question
        for hop in path:
            assert not mentions(task.question, hop["value"]), (task.question, hop["value"])


def test_snippets_never_state_a_fact(world):
    categories = COLOURS + INSTRUMENTS + INDUSTRIES
    for page in world.corpus:
        assert not re.search(r"\d", page.snippet), page.snippet
        assert not any(mentions(page.snippet, c) for c in categories), page.snippet
    for task in world.tasks:
        for hop in task.gold_path:
            snippet = world.corpus.get(hop["url"]).snippet
            assert not mentions(snippet, hop["value"]), (snippet, hop["value"])
            for answer in task.answers:
                assert not mentions(snippet, answer), (snippet, answer)


def test_pages_carry_distractors_about_other_entities(world):
    page = world.corpus.pages[0]
    sentences = _SENTENCE_END.split(page.text.replace("\n\n", " "))
    others = [s for s in sentences if page.title not in s]
    assert len(others) >= 2  # the two distractors (inverse mentions name the page too)
    no_distractors = generate_world(n_pages=600, seed=3, distractors_per_page=0)
    assert len(no_distractors.corpus.pages[0].text) < len(page.text)


def test_names_never_start_like_a_fact_keyword(world):
    # A name word that shares a stem with a keyword would drown the keyword on its page.
    prefixes = tuple({f.keyword[:4] for f in FACTS.values()})
    for page in world.corpus:
        for word in page.title.split():
            assert not word.lower().startswith(prefixes), page.title


def test_answers_have_useful_aliases(world):
    numeric = [t for t in world.tasks if t.meta["answer_type"] in ("count", "measure")]
    assert numeric
    for task in numeric:
        plain = task.answers[0].split()[0].replace(",", "")
        assert plain in task.answers or task.answers[0] == plain


def test_meta_records_how_the_world_was_made(world):
    assert world.meta["generator"] == "venus_gym.worlds.synthetic"
    assert world.meta["seed"] == 3 and world.meta["size"] == 600
    assert world.meta["version"] >= 1


def test_save_load_round_trip(world, tmp_path):
    world.save(tmp_path / "w")
    loaded = World.load(tmp_path / "w")
    assert loaded.name == world.name
    assert loaded.meta == world.meta
    assert loaded.corpus.pages == world.corpus.pages
    assert loaded.tasks == world.tasks
    assert [t.meta for t in loaded.tasks] == [t.meta for t in world.tasks]
    assert load_world(tmp_path / "w").tasks == world.tasks


def test_load_world_synthetic_passes_settings_through():
    w = load_world("synthetic", n_pages=150, seed=9)
    assert len(w.corpus) == 150 and w.meta["seed"] == 9
