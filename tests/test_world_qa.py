"""Real-data worlds: the packaged HotpotQA subset, the QA JSONL loader's url scheme,
gold ordering and error reporting, and `load_world` dispatch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from venus_gym.corpus import DataFormatError
from venus_gym.worlds import WORLD_NAMES, load_world, packaged_data_path
from venus_gym.worlds.qa import load_qa_world, make_snippet, title_url

HOTPOT_FILE = "hotpotqa_dev_distractor_500.jsonl"


def _record(qid: str, paragraphs: list[tuple[str, str, bool]], **extra) -> dict:
    return {"id": qid, "question": f"Question {qid}?", "answers": ["Alpha"],
            "paragraphs": [{"title": t, "text": x, "is_supporting": s} for t, x, s in paragraphs],
            "source": "test", **extra}


def _write(path: Path, lines: list) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n",
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def hotpot():
    return load_world("hotpotqa")


def test_packaged_hotpotqa_has_500_two_hop_tasks_with_gold_pages(hotpot):
    assert len(hotpot.tasks) == 500
    for task in hotpot.tasks:
        assert task.hops == 2 and len(task.gold_urls) == 2
        assert len(set(task.gold_urls)) == 2
        for url in task.gold_urls:
            assert url in hotpot.corpus
            assert url.startswith("https://en.wikipedia.org/wiki/")
        assert task.source == "hotpotqa-dev"
        assert task.answers and task.answers[0]


def test_packaged_hotpotqa_corpus_is_every_distinct_paragraph(hotpot):
    distinct, supporting = set(), {}
    with packaged_data_path(HOTPOT_FILE).open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            for p in record["paragraphs"]:
                distinct.add((p["title"], p["text"]))
                if p["is_supporting"]:
                    supporting.setdefault(record["id"], set()).add(p["title"])
    assert len(hotpot.corpus) == len(distinct)
    assert {(p.title, p.text) for p in hotpot.corpus} == distinct
    for task in hotpot.tasks:
        assert {hotpot.corpus.get(u).title for u in task.gold_urls} == supporting[task.id]


def test_packaged_hotpotqa_is_cached_but_callers_get_their_own_task_list(hotpot):
    again = load_world("hotpotqa")
    assert again.corpus is hotpot.corpus  # parsed once per process
    again.tasks.clear()
    assert len(load_world("hotpotqa").tasks) == 500


def test_packaged_data_ships_with_attribution():
    readme = packaged_data_path("README.md").read_text(encoding="utf-8")
    assert "CC BY-SA 4.0" in readme and "yang2018hotpotqa" in readme
    assert "Changes made" in readme
    notice = packaged_data_path("LICENSE-hotpotqa-CC-BY-SA-4.0.txt").read_text(encoding="utf-8")
    assert "creativecommons.org/licenses/by-sa/4.0" in notice


def test_urls_follow_wikipedia_and_disambiguate_shared_titles(tmp_path):
    path = _write(tmp_path / "qa.jsonl", [
        _record("q1", [("Alpha Beta", "First text. More.", True), ("Why? #1", "Odd title.", False)]),
        # same (title, text) again: deduplicated; same title, new text: "#2"
        _record("q2", [("Alpha Beta", "First text. More.", False),
                       ("Alpha Beta", "Another version.", True)]),
    ])
    world = load_qa_world(path)
    assert [p.url for p in world.corpus] == [
        "https://en.wikipedia.org/wiki/Alpha_Beta",
        "https://en.wikipedia.org/wiki/Why%3F_%231",
        "https://en.wikipedia.org/wiki/Alpha_Beta#2",
    ]
    assert world.tasks[1].gold_urls == ("https://en.wikipedia.org/wiki/Alpha_Beta#2",)
    assert world.corpus.pages[0].snippet == "First text."
    assert world.name == "qa"


def test_title_url_and_snippet_helpers():
    assert title_url("Kiss and Tell (1945 film)") == \
        "https://en.wikipedia.org/wiki/Kiss_and_Tell_(1945_film)"
    long_sentence = "word " * 100
    snippet = make_snippet(long_sentence + ". Next.")
    assert len(snippet) <= 204 and snippet.endswith(" ...")


def test_musique_style_decomposition_orders_gold_path(tmp_path):
    record = _record("m1", [("P0", "Distractor.", False), ("P1", "Beta is in Gamma.", True),
                            ("P2", "Alpha works for Beta.", True)],
                     meta={"question_decomposition": [
                         {"question": "Alpha >> employer", "answer": "Beta",
                          "paragraph_support_idx": 2},
                         {"question": "Where is #1?", "answer": "Gamma",
                          "paragraph_support_idx": 1}]})
    record["answers"] = ["Gamma"]
    task = load_qa_world(_write(tmp_path / "m.jsonl", [record])).tasks[0]
    assert [h["entity"] for h in task.gold_path] == ["P2", "P1"]
    assert [h["value"] for h in task.gold_path] == ["Beta", "Gamma"]
    assert task.gold_path[0]["goal"] == "Find the employer of Alpha"
    assert task.gold_path[1]["goal"] == "Find out: Where is Beta?"
    assert task.meta["question_decomposition"][0]["answer"] == "Beta"


def test_answer_bearing_paragraph_gets_the_answer_as_its_value(tmp_path):
    record = _record("h1", [("A", "Nothing here.", True), ("B", "It was Alpha all along.", True)])
    task = load_qa_world(_write(tmp_path / "h.jsonl", [record])).tasks[0]
    assert [h["value"] for h in task.gold_path] == ["", "Alpha"]


def test_malformed_lines_raise_with_file_and_line(tmp_path):
    good = _record("ok", [("A", "Text.", True)])
    broken_json = _write(tmp_path / "a.jsonl", [good, "{not json"])
    with pytest.raises(DataFormatError, match=r"a\.jsonl:2:"):
        load_qa_world(broken_json)
    no_answers = dict(good, id="bad", answers=[])
    bad_schema = _write(tmp_path / "b.jsonl", [good, dict(good, id="ok2"), no_answers])
    with pytest.raises(DataFormatError, match=r"b\.jsonl:3: 'answers'"):
        load_qa_world(bad_schema)
    bad_paragraph = dict(good, paragraphs=[{"title": "A", "text": 5}])
    with pytest.raises(DataFormatError, match=r"c\.jsonl:1: paragraph 0"):
        load_qa_world(_write(tmp_path / "c.jsonl", [bad_paragraph]))


def test_skip_bad_skips_and_lists_every_bad_line(tmp_path):
    good = _record("ok", [("A", "Text.", True)])
    path = _write(tmp_path / "d.jsonl", [good, "{not json", dict(good, id="x", answers=[]),
                                         dict(good, id="ok2")])
    world = load_qa_world(path, skip_bad=True)
    assert [t.id for t in world.tasks] == ["ok", "ok2"]
    skipped = world.meta["skipped"]
    assert len(skipped) == 2
    assert skipped[0].startswith(f"{path}:2:") and skipped[1].startswith(f"{path}:3:")


def test_load_world_dispatches_on_paths_and_rejects_unknown_names(tmp_path):
    path = _write(tmp_path / "mine.jsonl", [_record("q", [("A", "Alpha.", True)])])
    assert load_world(path, name="custom").name == "custom"
    assert load_world(str(path)).tasks[0].id == "q"
    saved = load_world(path).save(tmp_path / "saved")
    assert load_world(saved).tasks[0].gold_urls == ("https://en.wikipedia.org/wiki/A",)
    with pytest.raises(ValueError) as err:
        load_world("no-such-world")
    for name in WORLD_NAMES:
        assert name in str(err.value)
    with pytest.raises(TypeError):
        load_world("hotpotqa", seed=3)
    with pytest.raises(FileNotFoundError):
        load_qa_world(tmp_path / "missing.jsonl")


def test_missing_ids_are_named_by_file_and_line_and_duplicates_rejected(tmp_path):
    import json

    from venus_gym.corpus import DataFormatError

    record = {"question": "q?", "answers": ["a"],
              "paragraphs": [{"title": "T", "text": "a b", "is_supporting": True}]}
    path = tmp_path / "noid.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n")
    world = load_qa_world(path)
    assert [t.id for t in world.tasks] == ["noid:1", "noid:2"]
    dup = tmp_path / "dup.jsonl"
    dup.write_text(json.dumps({**record, "id": "x"}) + "\n" + json.dumps({**record, "id": "x"}))
    with pytest.raises(DataFormatError, match=r"dup.jsonl:2: duplicate id 'x' \(first on line 1\)"):
        load_qa_world(dup)
