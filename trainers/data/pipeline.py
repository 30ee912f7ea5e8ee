"""The SFT data pipeline: convert -> prune -> dedup -> filter -> resample, with a report.

    report = run_pipeline(["redsearcher.jsonl"], "data/sft", PipelineConfig(judge="f1"))

writes `data/sft/{converted,pruned,deduped,filtered,resampled}.jsonl` (Trajectory JSONL;
`resampled.jsonl` is the training set; only that one with write_intermediate=False),
`report.json` (the whole `PipelineConfig` included) and `report.txt`. `run_stages` runs any
subset in order (the single-stage CLI commands use it).

Stages stream: each trajectory flows through all stages before the next is read, so memory
stays at one trajectory (a chunk of them while an LLM judge works), whatever the input
size. One progress bar counts input records. Stage semantics: `convert`, `clean`
(prune, dedup), `judge` (filter), `resample`; the report: `report`.

Where we deviate from DR-Venus and why
* The default judge is exact match (offline, deterministic), not an LLM: the pipeline must
  run on a laptop without an endpoint. `judge="llm"` with an endpoint reproduces the paper.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from trainers.data.clean import dedup_stream, prune_stream
from trainers.data.convert import INPUT_FORMATS, count_turns, read_inputs
from trainers.data.judge import FilterTally, Judge, LLMJudge, MetricJudge, filter_stream
from trainers.data.report import DEFAULT_HISTOGRAM_EDGES, PipelineReport, StageReport, TurnHistogram
from trainers.data.resample import TurnWeights, resample_stream
from trainers.trajectory import Trajectory, Turn
from venus_gym.corpus import atomic_output, count_lines, json_line
from venus_gym.protocol import DEFAULT_TOOLS, render_system_prompt

STAGES: tuple[str, ...] = ("convert", "prune", "dedup", "filter", "resample")
OUTPUT_NAMES: dict[str, str] = {"convert": "converted.jsonl", "prune": "pruned.jsonl",
                                "dedup": "deduped.jsonl", "filter": "filtered.jsonl",
                                "resample": "resampled.jsonl"}
JUDGES: tuple[str, ...] = ("em", "f1", "llm", "none")


def _option(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class PipelineConfig:
    """Every knob of the data pipeline; `help()` lists them (the CLI flags are the same names)."""

    input_format: str = _option("auto", "input records: 'auto' (per record), 'drvenus' "
                                "(messages JSON) or 'trajectory' (our schema)")
    tools: tuple[str, ...] = _option(DEFAULT_TOOLS, "tools kept; our system prompt offers exactly "
                                     "these and calls to any other tool are pruned")
    prompt_date: str | None = _option(None, "'Current date:' of the system prompt; default: the "
                                      "source prompt's date, else the protocol default")
    judge: str = _option("em", "correctness judge: 'em', 'f1' (venus_gym.scoring), 'llm' "
                         "(BrowseComp grader over an OpenAI-compatible endpoint) or 'none'")
    judge_threshold: float = _option(0.5, "em/f1 judges: keep when score >= this")
    llm_base_url: str = _option("", "llm judge: endpoint, e.g. http://127.0.0.1:8000/v1")
    llm_model: str = _option("", "llm judge: model name served by the endpoint")
    llm_api_key_env: str = _option("OPENAI_API_KEY", "llm judge: environment variable holding "
                                   "the API key (the key is never logged)")
    llm_timeout_s: float = _option(60.0, "llm judge: per-request timeout in seconds")
    llm_retries: int = _option(2, "llm judge: extra attempts after a failed request")
    llm_backoff_s: float = _option(1.0, "llm judge: first retry delay (doubles, capped at 30 s)")
    llm_workers: int = _option(4, "llm judge: concurrent requests")
    on_judge_error: str = _option("fail", "when the judge fails: 'fail' (stop with the error) or "
                                  "'keep' (keep the trajectory, list it in the report)")
    turn_thresholds: tuple[int, ...] = _option((50, 100), "resampling: upper turn counts of the "
                                               "buckets but the last (strictly increasing)")
    turn_weights: tuple[float, ...] = _option((1.0, 2.0, 5.0), "resampling: weight per bucket "
                                              "(fractional part = probability of one more copy)")
    resample_seed: int = _option(0, "resampling: seed for fractional weights")
    histogram_edges: tuple[int, ...] = _option(DEFAULT_HISTOGRAM_EDGES, "report: upper edges "
                                               "of the turn-count histogram bins")
    long_turns: int = _option(100, "report: share of trajectories with more turns than this")
    skip_bad: bool = _option(False, "skip malformed input lines and list them in the report "
                                    "(default: stop at the first, naming file:line)")
    write_intermediate: bool = _option(True, "run_pipeline: write every stage's output, not "
                                             "only the final one")
    progress: bool = _option(True, "show progress bars")

    def __post_init__(self) -> None:
        for name in ("tools", "turn_thresholds", "turn_weights", "histogram_edges"):
            setattr(self, name, tuple(getattr(self, name)))
        if self.input_format not in INPUT_FORMATS:
            raise ValueError(f"input_format must be one of {list(INPUT_FORMATS)}, "
                             f"got {self.input_format!r}")
        if self.judge not in JUDGES:
            raise ValueError(f"judge must be one of {list(JUDGES)}, got {self.judge!r}")
        if self.on_judge_error not in ("fail", "keep"):
            raise ValueError(f"on_judge_error must be 'fail' or 'keep', got {self.on_judge_error!r}")
        render_system_prompt(self.tools)  # rejects unknown, repeated or no tools by name
        self.turn_weights_spec()
        TurnHistogram(self.histogram_edges, self.long_turns)

    def turn_weights_spec(self) -> TurnWeights:
        return TurnWeights(tuple(int(t) for t in self.turn_thresholds),
                           tuple(float(w) for w in self.turn_weights))

    def to_json(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PipelineConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown pipeline config field(s) {unknown}; known: {sorted(known)}")
        try:
            return cls(**data)
        except TypeError as e:  # a wrong type in a config file: name it, no traceback
            raise ValueError(f"pipeline config: {e}") from None

    @classmethod
    def help(cls) -> str:
        defaults = cls()
        return "\n".join(f"{f.name} (default {getattr(defaults, f.name)!r}): {f.metadata['help']}"
                         for f in dataclasses.fields(cls))


def make_judge(config: PipelineConfig) -> Judge | None:
    """The judge the config asks for; None for judge='none' (the filter keeps everything)."""
    if config.judge in ("em", "f1"):
        return MetricJudge(config.judge, config.judge_threshold)
    if config.judge == "llm":
        return LLMJudge(config.llm_base_url, config.llm_model, config.llm_api_key_env,
                        config.llm_timeout_s, config.llm_retries, config.llm_backoff_s)
    return None


_TRAJECTORY_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Trajectory))
_TURN_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Turn))


def trajectory_record(trajectory: Trajectory) -> dict[str, Any]:
    """Equal to `trajectory.to_json()` but without `dataclasses.asdict`'s deep copy, which
    took over half the pipeline's time on long trajectories (the dict is only serialised)."""
    record = {name: getattr(trajectory, name) for name in _TRAJECTORY_FIELD_NAMES}
    record["turns"] = [{name: getattr(turn, name) for name in _TURN_FIELD_NAMES}
                       for turn in trajectory.turns]
    if trajectory.turn_spans is not None:
        record["turn_spans"] = [list(span) for span in trajectory.turn_spans]
    return record


class _JsonlWriter:
    """Writes one stage's output under a temporary name; `commit` renames it into place."""

    def __init__(self, path: Path):
        self.path = path
        self._output = atomic_output(path)
        self.temporary = self._output.__enter__()
        self.file: TextIO = self.temporary.open("w", encoding="utf-8")

    def write(self, trajectory: Trajectory) -> None:
        self.file.write(json_line(trajectory_record(trajectory)))

    def commit(self) -> None:
        self.file.close()
        self._output.__exit__(None, None, None)

    def discard(self, error: BaseException) -> None:
        self.file.close()
        try:
            self._output.__exit__(type(error), error, error.__traceback__)
        except BaseException as raised:  # atomic_output re-raises the error it was given
            if raised is not error:
                raise


def _observed(stream: Iterable[Trajectory], stage: StageReport, writer: _JsonlWriter | None
              ) -> Iterator[Trajectory]:
    """Count, histogram and (optionally) write a stage's output as it streams past."""
    for trajectory in stream:
        stage.outputs += 1
        stage.output_turns.add(count_turns(trajectory))
        if writer is not None:
            writer.write(trajectory)
        yield trajectory


def run_stages(inputs: Sequence[str | Path], stages: Sequence[str],
               outputs: dict[str, Path], config: PipelineConfig,
               input_format: str | None = None) -> PipelineReport:
    """Read `inputs`, run `stages` (a subsequence of STAGES) in order, write `outputs`.

    Args:
        inputs: JSONL files. Without "convert" in `stages` they are read as Trajectory
            JSONL (a stage named "read" reports them).
        outputs: stage name -> output path; stages without an entry are not written.
        input_format: overrides config.input_format (defaults to "trajectory" when the
            convert stage is not run).

    Raises:
        DataFormatError: a bad input line (file:line) when config.skip_bad is off.
        JudgeError: a judge failure when config.on_judge_error is "fail".
    """
    unknown = [s for s in stages if s not in STAGES]
    if unknown or list(stages) != sorted(stages, key=STAGES.index):
        raise ValueError(f"stages must be a subsequence of {list(STAGES)}, got {list(stages)}")
    edges, long_turns = config.histogram_edges, config.long_turns

    def new_stage(name: str) -> StageReport:
        return StageReport(name, output_turns=TurnHistogram(edges, long_turns))

    report = PipelineReport(config=config.to_json(), inputs=[str(p) for p in inputs])
    first = new_stage("convert" if "convert" in stages else "read")
    report.stages.append(first)
    total_lines = count_lines(inputs)
    first.inputs = total_lines
    fmt = input_format or (config.input_format if "convert" in stages else "trajectory")
    repairs: Counter[str] = Counter()
    duplicates: list[str] = []
    records = read_inputs(inputs, config.tools, fmt, config.prompt_date, config.skip_bad,
                          report.bad_lines, repairs, duplicates)
    progress = tqdm(records, total=total_lines, desc="data", unit="record",
                    disable=not config.progress, leave=False)
    writers: list[_JsonlWriter] = []

    def writer_for(name: str) -> _JsonlWriter | None:
        if name not in outputs:
            return None
        writers.append(_JsonlWriter(Path(outputs[name])))
        return writers[-1]

    stream: Iterable[Trajectory] = _observed(progress, first, writer_for(first.stage))
    finishers: list[Callable[[], None]] = []
    for name in stages:
        if name == "convert":
            continue
        stage = new_stage(name)
        report.stages.append(stage)
        stream = _observed(_stage_stream(name, stream, stage, config, finishers), stage,
                           writer_for(name))
    started = time.perf_counter()
    try:
        for _ in stream:
            pass
    except BaseException as error:
        # Nothing half-written: outputs appear only once every stage has run to the end.
        for writer in writers:
            writer.discard(error)
        raise
    finally:
        progress.close()
    for writer in writers:
        writer.commit()
    report.seconds = time.perf_counter() - started
    for finish in finishers:
        finish()
    first.counts.update(repairs)
    first.notes.extend(duplicates)
    first.removed["bad line, skipped"] = len(report.bad_lines)
    for previous, stage in zip(report.stages, report.stages[1:]):
        stage.inputs = previous.outputs
    for stage in report.stages:
        name = stage.stage if stage.stage in outputs else None
        stage.output_path = str(outputs[name]) if name else None
    return report


def _stage_stream(name: str, stream: Iterable[Trajectory], stage: StageReport,
                  config: PipelineConfig, finishers: list[Callable[[], None]]
                  ) -> Iterator[Trajectory]:
    """Wrap `stream` in stage `name`; `finishers` copy its tallies into `stage` at the end."""
    if name in ("prune", "dedup"):
        per_tool: Counter[str] = Counter()
        changed: Counter[str] = Counter()
        wrap = prune_stream if name == "prune" else dedup_stream
        what = "turns pruned" if name == "prune" else "duplicate interactions removed"

        def finish_clean() -> None:
            stage.counts[f"{what} (all tools)"] = sum(per_tool.values())
            stage.counts.update({f"{what} ({tool})": n for tool, n in per_tool.items()})
            stage.counts["trajectories changed"] = changed["trajectories"]
        finishers.append(finish_clean)
        return wrap(stream, config.tools, per_tool, changed)
    if name == "filter":
        judge = make_judge(config)
        if judge is None:
            stage.notes.append("judge 'none': every trajectory kept unjudged")
            return iter(stream)
        tally = FilterTally()

        def finish_filter() -> None:
            stage.removed.update(tally.dropped)
            stage.notes.extend(f"kept despite judge error: {e}" for e in tally.kept_on_error)
            stage.counts["kept despite judge error"] = len(tally.kept_on_error)
        finishers.append(finish_filter)
        stage.notes.append(f"judge: {judge.name}")
        workers = config.llm_workers if config.judge == "llm" else 1
        return filter_stream(stream, judge, tally, config.on_judge_error, workers)
    assert name == "resample"
    by_bucket: Counter[str] = Counter()
    weights = config.turn_weights_spec()

    def finish_resample() -> None:
        dropped = by_bucket.pop("dropped (0 copies)", 0)
        if dropped:
            stage.removed["0 copies (weight 0 or fractional draw)"] = dropped
        stage.counts.update({f"copies written ({bucket} turns)": by_bucket[bucket]
                             for bucket in weights.bucket_names()})
    finishers.append(finish_resample)
    stage.notes.append(f"weights {list(weights.weights)} at thresholds {list(weights.thresholds)}")
    return resample_stream(stream, weights, config.resample_seed, by_bucket)


def run_pipeline(inputs: Sequence[str | Path], out_dir: str | Path,
                 config: PipelineConfig | None = None) -> PipelineReport:
    """Run every stage (module docstring); returns the report it also writes to out_dir.

    Nothing half-written is ever left in `out_dir`: a new directory is built under a
    temporary name next to it (`.NAME.tmp-*`) and renamed when complete; into an existing
    directory every file is written under a temporary name and renamed when its stage
    completes, report.json last, so a report.json describes complete files.
    """
    config = config or PipelineConfig()
    out_dir = Path(out_dir)
    names = STAGES if config.write_intermediate else STAGES[-1:]
    if out_dir.exists():
        outputs = {name: out_dir / OUTPUT_NAMES[name] for name in names}
        report = run_stages(inputs, STAGES, outputs, config)
        report.write(out_dir / "report.json", out_dir / "report.txt")
        return report
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Not mkdtemp: its mode 0700 would survive the rename.
    staging = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        outputs = {name: staging / OUTPUT_NAMES[name] for name in names}
        report = run_stages(inputs, STAGES, outputs, config)
        for stage in report.stages:  # the report names the final paths
            if stage.output_path is not None:
                stage.output_path = str(out_dir / Path(stage.output_path).name)
        report.write(staging / "report.json", staging / "report.txt")
        os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report
