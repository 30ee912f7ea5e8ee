"""Hostile input files for the data pipeline and the QA world loader.

Property tests feed random bytes, encodings, nesting depths, lone surrogates and wrong types
and check that nothing raises but the documented `DataFormatError` naming file:line, and
that every non-blank input line is accounted for: kept, or skipped with "file:line: why".
Unit tests pin one case of each class (docs/failure_behaviour.md).
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_data_fixtures import drvenus_record, search, visit, write_lines
from trainers.data.cli import main as data_main
from trainers.data.convert import convert_drvenus_record, read_inputs
from trainers.data.judge import JudgeError
from trainers.data.pipeline import OUTPUT_NAMES, STAGES, PipelineConfig, run_pipeline, run_stages
from trainers.trajectory import read_trajectories
from venus_gym.corpus import (
    MAX_JSON_DEPTH,
    DataFormatError,
    count_lines,
    detect_encoding,
    read_jsonl,
    write_jsonl,
)
from venus_gym.protocol import DEFAULT_TOOLS
from venus_gym.worlds.qa import load_qa_world

TOOLS = DEFAULT_TOOLS
PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BAD_LINE = re.compile(r"^.+:\d+: \S")


def quiet(**overrides: Any) -> PipelineConfig:
    return PipelineConfig(progress=False, **overrides)


def qa_record(qid: str = "q1", **extra: Any) -> dict[str, Any]:
    return {"id": qid, "question": "Where is Alpha?", "answers": ["Lumen"],
            "paragraphs": [{"title": "Alpha", "text": "Alpha is in Lumen.", "is_supporting": True},
                           {"title": "Beta", "text": "Beta is elsewhere.", "is_supporting": False}],
            "source": "test", **extra}


# --- strategies ----------------------------------------------------------------------------
json_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
                | st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=6)
lone_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


def _nested(depth: int) -> str:
    return '{"id": "deep", "messages": ' + "[" * depth + "]" * depth + "}"


@st.composite
def mutated_drvenus(draw: st.DrawFn) -> str:
    """A DR-Venus record with one field replaced by a value of any JSON type."""
    record = drvenus_record(draw(st.sampled_from(["a", "b", "a"])),
                            [search("q"), visit("u")], draw(st.sampled_from(["Paris", "Lyon"])))
    target = draw(st.sampled_from(["id", "task_id", "question", "answer", "answers",
                                   "messages", "role", "content", "tool_calls",
                                   "reasoning_content", "none"]))
    value = draw(json_values)
    if target in ("role", "content", "tool_calls", "reasoning_content"):
        index = draw(st.integers(0, len(record["messages"]) - 1))
        record["messages"][index][target] = value
    elif target != "none":
        record[target] = value
    return json.dumps(record)


@st.composite
def surrogate_record(draw: st.DrawFn) -> str:
    record = drvenus_record("s", [search("q")], "Paris")
    record["messages"][-1]["content"] += draw(lone_surrogates)
    return json.dumps(record)  # ensure_ascii: written as a \udXXX escape


@st.composite
def mutated_trajectory(draw: st.DrawFn) -> str:
    record = convert_drvenus_record(drvenus_record("t", [search("q")], "Paris"), "f",
                                    TOOLS).to_json()
    key = draw(st.sampled_from(["id", "answers", "question", "turns", "messages", "metadata",
                                "none"]))
    if key != "none":
        record[key] = draw(json_values)
    return json.dumps(record)


text_lines = st.one_of(
    mutated_drvenus(), mutated_trajectory(), surrogate_record(),
    st.sampled_from([10, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH + 1, 3000, 100_000]).map(_nested),
    json_values.map(json.dumps), st.text(max_size=20), st.just(""), st.just("   "),
)
lines = st.one_of(text_lines.map(lambda text: ("text", text)),
                  st.binary(max_size=30).map(lambda raw: ("bytes", raw)))
ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "latin-1"]


def encode_file(parts: list[tuple[str, Any]], encoding: str) -> bytes:
    """Each text line in `encoding` (latin-1: what it cannot hold becomes '?'), bytes as is."""
    body_encoding = {"utf-8-sig": "utf-8", "utf-16": "utf-16-le"}.get(encoding, encoding)
    newline = "\n".encode(body_encoding)
    chunks = []
    for kind, value in parts:
        if kind == "bytes":
            chunks.append(value)
        else:
            chunks.append(value.encode(body_encoding, errors="replace"
                                       if body_encoding == "latin-1" else "surrogatepass"))
    prefix = {"utf-8-sig": b"\xef\xbb\xbf", "utf-16": b"\xff\xfe"}.get(encoding, b"")
    return prefix + newline.join(chunks) + newline


# --- property tests: the pipeline ----------------------------------------------------------
@PROPERTY
@given(parts=st.lists(lines, max_size=8), encoding=st.sampled_from(ENCODINGS))
def test_pipeline_accounts_for_every_line_of_any_file(parts, encoding):
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        data = encode_file(parts, encoding)
        source.write_bytes(data)
        outputs = {name: Path(tmp) / "out" / OUTPUT_NAMES[name] for name in STAGES}
        report = run_stages([source], STAGES, outputs, quiet(skip_bad=True, judge="none"))
        first = report.stage("convert")
        total = count_lines([source])
        assert first.inputs == total == first.outputs + len(report.bad_lines)
        assert all(BAD_LINE.match(line) for line in report.bad_lines)
        if detect_encoding(data[:4]) == ("utf-8", 0):  # an independent count of the lines
            assert total == sum(1 for chunk in data.split(b"\n")
                                if chunk.decode("utf-8", "replace").strip())
        for stage in report.stages:  # every output is complete, valid Trajectory JSONL
            written = read_trajectories(outputs[stage.stage])
            assert len(written) == stage.outputs
        assert sorted(p.name for p in (Path(tmp) / "out").iterdir()) == \
            sorted(OUTPUT_NAMES.values())


@PROPERTY
@given(parts=st.lists(lines, min_size=1, max_size=6), encoding=st.sampled_from(ENCODINGS))
def test_pipeline_without_skip_bad_stops_only_with_file_and_line(parts, encoding):
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        source.write_bytes(encode_file(parts, encoding))
        out_dir = Path(tmp) / "out"
        try:
            report = run_pipeline([source], out_dir, quiet(judge="none"))
        except DataFormatError as e:
            assert str(e).startswith(f"{source}:") and BAD_LINE.match(str(e))
            assert sorted(p.name for p in Path(tmp).iterdir()) == ["in.jsonl"]
        else:
            assert not report.bad_lines
            assert report.stage("convert").outputs == count_lines([source])
            assert (out_dir / "report.json").is_file()


# --- property tests: the QA loader ---------------------------------------------------------
@st.composite
def mutated_qa(draw: st.DrawFn) -> str:
    record = qa_record(draw(st.sampled_from(["q1", "q2", "q1"])))
    if draw(st.booleans()):
        record["paragraphs"][0]["text"] += draw(lone_surrogates)
    key = draw(st.sampled_from(["id", "question", "answers", "paragraphs", "meta", "source",
                                "title", "text", "is_supporting", "none"]))
    value = draw(json_values)
    if key in ("title", "text", "is_supporting"):
        record["paragraphs"][draw(st.integers(0, 1))][key] = value
    elif key != "none":
        record[key] = value
    return json.dumps(record)


qa_lines = st.one_of(
    mutated_qa().map(lambda text: ("text", text)),
    text_lines.map(lambda text: ("text", text)),
    st.binary(max_size=30).map(lambda raw: ("bytes", raw)),
)


@PROPERTY
@given(parts=st.lists(qa_lines, max_size=8), encoding=st.sampled_from(ENCODINGS))
def test_qa_loader_accounts_for_every_line_of_any_file(parts, encoding):
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "qa.jsonl"
        source.write_bytes(encode_file(parts, encoding))
        world = load_qa_world(source, skip_bad=True)
        skipped = world.meta["skipped"]
        assert len(world.tasks) + len(skipped) == count_lines([source])
        assert all(BAD_LINE.match(line) for line in skipped)
        assert len({task.id for task in world.tasks}) == len(world.tasks)
        for task in world.tasks:
            assert all(url in world.corpus for url in task.gold_urls)
        try:
            strict = load_qa_world(source)
        except DataFormatError as e:
            assert skipped and str(e) == skipped[0]
        else:
            assert not skipped and len(strict.tasks) == len(world.tasks)


# --- one case per class ----------------------------------------------------------------------
def good_lines(n: int = 2) -> list[str]:
    return [json.dumps(drvenus_record(f"r{i}", [search("q")], "Paris")) for i in range(n)]


def test_a_non_utf8_line_is_a_bad_line_and_the_rest_is_read(tmp_path):
    first, second = good_lines()
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(first.encode() + b"\n" + b'{"id": "caf\xe9"}\n' + second.encode() + b"\n")
    with pytest.raises(DataFormatError, match=r"mixed\.jsonl:2: cannot decode the line as UTF-8"):
        list(read_inputs([path]))
    bad: list[str] = []
    kept = list(read_inputs([path], skip_bad=True, bad_lines=bad))
    assert [t.id for t in kept] == ["r0", "r1"] and len(bad) == 1


def test_latin1_file_reports_each_undecodable_line(tmp_path):
    path = tmp_path / "latin.jsonl"
    record = drvenus_record("é", [search("café")], "Paris")
    path.write_bytes((json.dumps(record, ensure_ascii=False) + "\n" + good_lines(1)[0] + "\n")
                     .encode("latin-1"))
    bad: list[str] = []
    kept = list(read_inputs([path], skip_bad=True, bad_lines=bad))
    assert [t.id for t in kept] == ["r0"]
    assert bad[0].startswith(f"{path}:1: cannot decode") and "save the file as UTF-8" in bad[0]


@pytest.mark.parametrize("encoding,bom", [("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"),
                                          ("utf-16-le", b""), ("utf-16-be", b""),
                                          ("utf-8", b"\xef\xbb\xbf")])
def test_utf16_and_bom_files_are_read_whole(tmp_path, encoding, bom):
    record = drvenus_record("ü", [search("Zürich 東京")], "Zürich", gold="Zürich")
    text = json.dumps(record, ensure_ascii=False) + "\r\n\n" + good_lines(1)[0] + "\n"
    path = tmp_path / "wide.jsonl"
    path.write_bytes(bom + text.encode(encoding))
    kept = list(read_inputs([path]))
    assert [t.id for t in kept] == ["ü", "r0"] and kept[0].answers == ["Zürich"]
    assert count_lines([path]) == 2


def test_deep_nesting_is_a_bad_line_with_or_without_skip_bad(tmp_path):
    path = write_lines(tmp_path / "deep.jsonl", [*good_lines(1), _nested(100_000),
                                                 _nested(MAX_JSON_DEPTH + 1)])
    with pytest.raises(DataFormatError, match=r"deep\.jsonl:2: JSON nested too deeply"):
        list(read_inputs([path]))
    report = run_stages([path], STAGES, {}, quiet(skip_bad=True))
    assert [line.split(": ", 1)[0] for line in report.bad_lines] == [f"{path}:2", f"{path}:3"]
    assert report.stage("convert").outputs == 1


def test_lone_surrogate_record_is_refused_whole_and_the_output_is_complete(tmp_path):
    record = drvenus_record("s", [search("q")], "Paris")
    record["messages"][1]["content"] += "\ud800"
    paired = drvenus_record("pair", [search("q \U0001F600")], "Paris")  # a valid pair
    path = write_lines(tmp_path / "s.jsonl", [json.dumps(record), json.dumps(paired),
                                              *good_lines(1)])
    with pytest.raises(DataFormatError, match=r"s\.jsonl:1: a string holds a lone surrogate"):
        run_pipeline([path], tmp_path / "strict", quiet())
    assert not (tmp_path / "strict").exists()
    report = run_pipeline([path], tmp_path / "out", quiet(skip_bad=True))
    assert len(report.bad_lines) == 1 and report.stage("convert").outputs == 2
    assert {t.id for t in read_trajectories(tmp_path / "out" / "converted.jsonl")} == \
        {"pair", "r0"}
    assert (tmp_path / "out" / "report.json").is_file()


def test_writers_never_fail_on_a_lone_surrogate(tmp_path):
    # Records read from files cannot hold one; metadata added later (a judge's reply) might.
    write_jsonl(tmp_path / "w.jsonl", [{"detail": "x\udc80y"}])
    assert json.loads((tmp_path / "w.jsonl").read_text(encoding="utf-8")) == {"detail": "x\udc80y"}


def test_null_assistant_content_without_a_tool_call_is_a_bad_record(tmp_path):
    record = drvenus_record("n", [search("q")], "Paris")
    record["messages"].insert(4, {"role": "assistant", "content": None})
    empty = drvenus_record("e", [search("q")], "Paris")
    empty["messages"][2]["content"] = "   "
    tool_null = drvenus_record("t", [search("q")], "Paris")
    tool_null["messages"][3] = {"role": "tool", "content": None}
    path = write_lines(tmp_path / "n.jsonl", [record, empty, tool_null, *good_lines(1)])
    report = run_stages([path], ["convert"], {}, quiet(skip_bad=True))
    assert report.stage("convert").outputs == 1
    assert "messages[4]: an assistant message with no content and no tool call" in \
        report.bad_lines[0]
    assert "messages[2]: an assistant message with no content" in report.bad_lines[1]
    assert "messages[3]: content is null" in report.bad_lines[2]


@pytest.mark.parametrize("gold,answers,counts", [
    ([None, "Paris"], ["Paris"], {"answers_dropped": 1}),
    (42, ["42"], {"answers_coerced_to_string": 1}),
    (["Paris", 2.5, True], ["Paris", "2.5", "true"], {"answers_coerced_to_string": 2}),
    (["Paris", float("nan"), {"x": 1}, [1]], ["Paris"], {"answers_dropped": 3}),
    (None, [], {}),
    ([], [], {}),
])
def test_gold_answers_follow_the_documented_rule(gold, answers, counts):
    record = drvenus_record("g", [search("q")], "Paris", gold=None)
    record["answers"] = gold
    counters: Counter[str] = Counter()
    trajectory = convert_drvenus_record(record, "f", TOOLS, counters=counters)
    assert trajectory.answers == answers
    assert {k: v for k, v in counters.items() if k.startswith("answers")} == counts


@pytest.mark.parametrize("gold", [[None], float("nan"), [float("inf")], {"text": "Paris"}])
def test_an_answer_field_with_no_usable_answer_refuses_the_record(gold):
    record = drvenus_record("g", [search("q")], "Paris", gold=None)
    record["answer"] = gold
    with pytest.raises(ValueError, match="'answer' holds no usable answer"):
        convert_drvenus_record(record, "f", TOOLS)


@pytest.mark.parametrize("key,value", [("id", True), ("id", 1.5), ("id", ["x"]),
                                       ("task_id", {"a": 1}), ("question", 42)])
def test_wrong_typed_ids_and_questions_are_refused_not_coerced(key, value):
    record = drvenus_record("x", [search("q")], "Paris")
    record[key] = value
    with pytest.raises(ValueError, match=f"'{key}' must be a string"):
        convert_drvenus_record(record, "f", TOOLS)


def test_duplicate_ids_are_kept_counted_and_listed(tmp_path):
    line = good_lines(1)[0]
    path = write_lines(tmp_path / "d.jsonl", [line, line, line])
    report = run_stages([path], ["convert"], {}, quiet())
    convert = report.stage("convert")
    assert convert.outputs == 3 and convert.counts["duplicate_ids_kept"] == 2
    assert convert.notes == [f"{path}:2: duplicate id 'r0' (first at {path}:1); kept",
                             f"{path}:3: duplicate id 'r0' (first at {path}:1); kept"]


class _FailingJudge:
    name = "failing"

    def __init__(self, after: int):
        self.left = after

    def judge(self, question, prediction, answers):
        self.left -= 1
        if self.left < 0:
            raise JudgeError("endpoint down")
        from trainers.data.judge import Verdict
        return Verdict(True, 1.0)


def test_a_failed_run_leaves_no_output_directory_and_no_temporary_files(tmp_path, monkeypatch):
    path = write_lines(tmp_path / "in.jsonl", good_lines(80))  # more than one judge chunk
    monkeypatch.setattr("trainers.data.pipeline.make_judge", lambda config: _FailingJudge(70))
    with pytest.raises(JudgeError):
        run_pipeline([path], tmp_path / "new", quiet())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    # Into an existing directory: the earlier outputs stay as they were.
    existing = tmp_path / "old"
    existing.mkdir()
    (existing / "resampled.jsonl").write_text("earlier\n", encoding="utf-8")
    with pytest.raises(JudgeError):
        run_pipeline([path], existing, quiet())
    assert [p.name for p in existing.iterdir()] == ["resampled.jsonl"]
    assert (existing / "resampled.jsonl").read_text(encoding="utf-8") == "earlier\n"


def test_a_stage_command_may_write_over_its_own_input(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", good_lines(3))
    assert data_main(["convert", str(path), "-o", str(path)]) == 0
    assert data_main(["prune", str(path), "-o", str(path)]) == 0
    assert [t.id for t in read_trajectories(path)] == ["r0", "r1", "r2"]


def test_cli_reports_bad_files_without_a_traceback(tmp_path, capsys):
    assert data_main(["all", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o")]) == 1
    assert "No such file" in capsys.readouterr().err
    wide = tmp_path / "wide.jsonl"
    wide.write_bytes(("\n".join(good_lines(2)) + "\n").encode("utf-16"))
    assert data_main(["all", str(wide), "-o", str(tmp_path / "o"), "--no-progress"]) == 0
    saved = json.loads((tmp_path / "o" / "report.json").read_text(encoding="utf-8"))
    assert saved["stages"][0]["outputs"] == 2
    bad_config = tmp_path / "config.json"
    bad_config.write_bytes(b"\xff[")
    assert data_main(["all", str(wide), "-o", str(tmp_path / "p"), "--config",
                      str(bad_config)]) == 1
    assert "is not a pipeline config" in capsys.readouterr().err


def test_qa_loader_names_file_and_line_for_each_class(tmp_path):
    cases = {
        "bytes": b'{"id": "caf\xe9"}',
        "deep": _nested(5000).encode(),
        "surrogate": json.dumps(qa_record("s", question="Where\ud800?")).encode(),
        "null answer": json.dumps(qa_record("n", answers=["Lumen", None])).encode(),
        "number answer": json.dumps(qa_record("m", answers=[42])).encode(),
        "bool id": json.dumps(qa_record(True)).encode(),
        "duplicate": json.dumps(qa_record("q1")).encode(),
    }
    path = tmp_path / "qa.jsonl"
    path.write_bytes(b"\n".join([json.dumps(qa_record("q1")).encode(), *cases.values()]) + b"\n")
    with pytest.raises(DataFormatError, match=r"qa\.jsonl:2: cannot decode"):
        load_qa_world(path)
    world = load_qa_world(path, skip_bad=True)
    assert [t.id for t in world.tasks] == ["q1"]
    assert [s.split(": ", 1)[0] for s in world.meta["skipped"]] == \
        [f"{path}:{n}" for n in range(2, 2 + len(cases))]


def test_qa_titles_that_share_a_url_get_distinct_urls(tmp_path):
    record = qa_record()
    record["paragraphs"].append({"title": "Alpha ", "text": "Other text.", "is_supporting": False})
    record["paragraphs"].append({"title": "A_B", "text": "x", "is_supporting": False})
    record["paragraphs"].append({"title": "A B", "text": "y", "is_supporting": False})
    path = write_lines(tmp_path / "qa.jsonl", [record])
    urls = [page.url for page in load_qa_world(path).corpus]
    assert len(set(urls)) == len(urls) == 5


def test_read_jsonl_blank_and_crlf_lines(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'{"a": 1}\r\n\r\n   \n{"b": 2}')
    assert list(read_jsonl(path)) == [(1, {"a": 1}), (4, {"b": 2})]
    assert count_lines([path]) == 2


def test_convert_does_not_mutate_its_input():
    record = drvenus_record("c", [search("q")], "Paris", gold=[1, None, "Paris"])
    before = copy.deepcopy(record)
    convert_drvenus_record(record, "f", TOOLS)
    assert record == before
