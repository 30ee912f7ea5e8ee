"""The one JSONL reader/writer (venus_gym.jsonl): every writer/reader pair of the project
gives back what it was given, for strings holding the characters other line splitters cut
at (U+0085, U+2028, U+2029), U+FEFF, NUL, lone surrogates and 1 MB strings.

Pairs: write_jsonl / read_jsonl, append_jsonl / iter_json_lines, write_trajectories /
read_trajectories, the data pipeline's writer / reader, `venus-gym eval`'s results writer /
read_finished, MetricsLogger / read_metrics and truncate_steps, write_trajectories / the
viewer. Readers of user input and training data refuse a record with a lone surrogate,
naming file:line (docs/failure_behaviour.md); every other reader returns it as written.
"""

from __future__ import annotations

import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from venus_gym.jsonl import (
    DataFormatError,
    append_jsonl,
    iter_json_lines,
    json_line,
    read_jsonl,
    write_jsonl,
)

SPECIALS = ["\u2028", "\u2029", "\x85", "\ufeff", "\x00", "\ud800", "\udfff", "\r", "\x1c",
            "\x0b", "\x0c", "\U0001f600", "é", '"', "\\", "\n"]
NASTY = "|".join(SPECIALS) + "x" * 1_000_000 + "|".join(reversed(SPECIALS))
# A high surrogate followed by a low one is two code points in a Python str, but JSON reads
# their escapes back as one astral character (RFC 8259); no writer can keep them apart.
SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")

texts = st.text(alphabet=st.sampled_from(SPECIALS) | st.characters(), max_size=20).filter(
    lambda s: not SURROGATE_PAIR.search(s))
PROPERTY = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def has_lone(strings: list[str]) -> bool:
    return any(LONE_SURROGATE.search(s) for s in strings)


def trajectories(strings: list[str], eval_metadata: bool = False) -> list:
    from trainers.trajectory import Trajectory

    out = []
    for index, text in enumerate(strings):
        metadata: dict = {"note": text, f"key {text}": [text, {"deeper": text}]}
        if eval_metadata:
            metadata["eval"] = {"task_index": index, "sample": 0}
        out.append(Trajectory(id=f"t{index}", task_id=text, question=text, answers=[text, "a"],
                              messages=[{"role": "system", "content": text},
                                        {"role": "user", "content": f"q {text}"}],
                              metadata=metadata))
    return out


# --- the pairs --------------------------------------------------------------------------------
def pair_write_read_jsonl(directory: Path, strings: list[str]) -> tuple[list, list]:
    rows = [{"text": s, s: [s, {"n": i}]} for i, s in enumerate(strings)]
    path = directory / "rows.jsonl"
    assert write_jsonl(path, rows) == len(rows)
    if has_lone(strings):  # input semantics: refused whole, by file:line
        with pytest.raises(DataFormatError, match=r"rows\.jsonl:\d+: a string holds a lone"):
            list(read_jsonl(path))
    else:
        assert [row for _, row in read_jsonl(path)] == rows
    return rows, [row for _, row in read_jsonl(path, allow_lone_surrogates=True)]


def pair_append_iter(directory: Path, strings: list[str]) -> tuple[list, list]:
    path = directory / "appended.jsonl"
    rows = [{"text": s} for s in strings]
    with path.open("a", encoding="utf-8") as handle:
        for row in rows:
            append_jsonl(handle, [row], fsync=False)
    lines = list(iter_json_lines(path, allow_lone_surrogates=True))
    assert [line.lineno for line in lines] == list(range(1, len(rows) + 1))
    return rows, [line.record for line in lines]


def pair_trajectories(directory: Path, strings: list[str]) -> tuple[list, list]:
    from trainers.trajectory import read_trajectories, write_trajectories

    written = trajectories(strings)
    path = directory / "trajectories.jsonl"
    write_trajectories(path, written)
    if has_lone(strings):  # training data: a tokenizer cannot encode it
        with pytest.raises(DataFormatError, match=r"trajectories\.jsonl:\d+: a string holds"):
            read_trajectories(path)
        return ([t.to_json() for t in written],
                [row for _, row in read_jsonl(path, allow_lone_surrogates=True)])
    return written, read_trajectories(path)


def pair_pipeline(directory: Path, strings: list[str]) -> tuple[list, list]:
    from trainers.data.pipeline import PipelineConfig, run_stages
    from trainers.trajectory import read_trajectories, write_trajectories

    written = [t for t, s in zip(trajectories(strings), strings, strict=True)
               if not LONE_SURROGATE.search(s)]  # refused on input (pair_trajectories)
    source, output = directory / "in.jsonl", directory / "out.jsonl"
    write_trajectories(source, written)
    run_stages([source], [], {"read": output}, PipelineConfig(progress=False))
    return written, read_trajectories(output)


def pair_eval_results(directory: Path, strings: list[str]) -> tuple[list, list]:
    from trainers.evaluation.run import read_finished

    written = trajectories(strings, eval_metadata=True)
    path = directory / "results.jsonl"
    with path.open("a", encoding="utf-8") as handle:
        append_jsonl(handle, [t.to_json() for t in written], fsync=True)
    finished = read_finished(path, k=1)
    # read_finished rewrites the file with the lines it kept: nothing may change.
    again = read_finished(path, k=1)
    assert [again[i][0] for i in sorted(again)] == [finished[i][0] for i in sorted(finished)]
    return written, [finished[i][0] for i in sorted(finished)]


def pair_metrics(directory: Path, strings: list[str]) -> tuple[list, list]:
    pytest.importorskip("torch")
    from trainers.checkpoint_files import truncate_steps
    from trainers.run_log import MetricsLogger, read_metrics

    names = [f"m/{s}" for s in strings]
    with MetricsLogger(directory / "run", total_steps=len(names) + 1, progress_bar=False,
                       tensorboard=False) as logger:
        for step, name in enumerate(names):
            logger.log(step, {name: float(step)})
    path = directory / "run" / "metrics.jsonl"
    read_back = [[k for k in row if k not in ("step", "time")] for row in read_metrics(path)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no line may look torn
        truncate_steps(path, len(names) // 2)
    assert [row["step"] for row in read_metrics(path)] == list(range(len(names) // 2))
    return [[name] for name in names], read_back


def pair_viewer(directory: Path, strings: list[str]) -> tuple[list, list]:
    from trainers.evaluation.viewer import read_records
    from trainers.trajectory import write_trajectories

    written = trajectories(strings)
    path = directory / "samples.jsonl"
    write_trajectories(path, written)
    return [t.to_json() for t in written], read_records(path)[0]


# Each pair writes records holding the strings and reads them back: (written, read back).
PAIRS: dict[str, Callable[[Path, list[str]], tuple[list, list]]] = {
    "write_jsonl/read_jsonl": pair_write_read_jsonl, "append_jsonl/iter_json_lines":
    pair_append_iter, "trajectories": pair_trajectories, "pipeline": pair_pipeline,
    "eval results": pair_eval_results, "metrics": pair_metrics, "viewer": pair_viewer}


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_every_pair_round_trips_each_special_character_and_a_1_mb_string(tmp_path, pair):
    written, read_back = PAIRS[pair](tmp_path, [*SPECIALS, NASTY, "plain"])
    assert written and read_back == written


@pytest.mark.parametrize("pair", sorted(PAIRS))
@PROPERTY
@given(strings=st.lists(texts, min_size=1, max_size=4))
def test_every_pair_round_trips_random_text(pair, strings):
    with tempfile.TemporaryDirectory() as directory:
        written, read_back = PAIRS[pair](Path(directory), strings)
    assert read_back == written


def test_a_line_holds_no_character_any_splitter_takes_for_a_line_end():
    line = json_line({"t": "|".join(SPECIALS), "k\u2028": 1})
    assert line.endswith("\n") and len(line[:-1].splitlines()) == 1
    assert line.isascii() or "\ufeff" in line  # U+FEFF is not a line end; kept as is
    line = json_line({"t": "a\u2028b\x85c"})
    assert line == '{"t": "a\\u2028b\\u0085c"}\n'


def test_files_from_older_versions_with_raw_line_separators_read_whole(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text('{"t": "a\u2028b\u2029c\x85d"}\n{"t": "e"}\n', encoding="utf-8")
    assert [row for _, row in read_jsonl(path)] == [{"t": "a\u2028b\u2029c\x85d"}, {"t": "e"}]
