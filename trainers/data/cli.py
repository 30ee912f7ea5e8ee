"""`venus-gym data ...`: one command per pipeline stage and one that runs them all.

    venus-gym data all      IN.jsonl... -o OUT_DIR      # every stage, report.json + report.txt
    venus-gym data convert  IN.jsonl... -o OUT.jsonl    # DR-Venus messages / our episodes -> Trajectory JSONL
    venus-gym data prune    IN.jsonl... -o OUT.jsonl    # drop calls to tools outside --tools (+ responses)
    venus-gym data dedup    IN.jsonl... -o OUT.jsonl    # drop repeated tool interactions (+ responses)
    venus-gym data filter   IN.jsonl... -o OUT.jsonl    # keep correct final answers (--judge em|f1|llm|none)
    venus-gym data resample IN.jsonl... -o OUT.jsonl    # turn-aware copies (--turn-thresholds/--turn-weights)
    venus-gym data report   PATH...                     # print a report.json, or turn stats of JSONL files
    venus-gym data config-help                          # every option with its help

Every stage command prints its report and writes it as JSON next to the output
(`OUT.jsonl.report.json`, or --report PATH). Stage commands other than convert read
Trajectory JSONL. Options are the `PipelineConfig` fields (`--config FILE.json` loads them;
flags given on the command line win). Inputs are UTF-8 (or UTF-16 with a byte-order mark),
decoded line by line. A malformed input line (undecodable, not JSON, nested too deeply,
a lone surrogate, a record of the wrong shape) stops the command with "file:line: why"
(exit status 1) unless --skip-bad is given; skipped lines are listed in the report. A judge
failure stops it too unless --on-judge-error keep. Outputs are written under temporary
names and renamed when complete: a failed run leaves no half-written output (see
docs/failure_behaviour.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from trainers.data.judge import JudgeError
from trainers.data.pipeline import STAGES, PipelineConfig, run_pipeline, run_stages
from trainers.data.report import PipelineReport, render_text
from venus_gym.corpus import DataFormatError

# How a PipelineConfig field's (string) annotation becomes an argparse option.
_SCALAR_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "str | None": str}
_LIST_TYPES: dict[str, Any] = {"tuple[str, ...]": str, "tuple[int, ...]": int,
                               "tuple[float, ...]": float}


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("pipeline options (PipelineConfig)")
    group.add_argument("--config", help="JSON file of PipelineConfig fields")
    defaults = PipelineConfig()
    for config_field in dataclasses.fields(PipelineConfig):
        name, annotation = config_field.name, str(config_field.type)
        flag = "--" + name.replace("_", "-")
        help_text = f"{config_field.metadata['help']} (default: {getattr(defaults, name)!r})"
        # SUPPRESS: only flags actually given override the --config file and the defaults.
        common: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if annotation == "bool":
            if getattr(defaults, name):
                group.add_argument("--no-" + name.replace("_", "-"), action="store_false",
                                   **common)
            else:
                group.add_argument(flag, action="store_true", **common)
        elif annotation in _LIST_TYPES:
            group.add_argument(flag, nargs="+", type=_LIST_TYPES[annotation], **common)
        else:
            group.add_argument(flag, type=_SCALAR_TYPES[annotation], **common)


def _read_json_file(path: str, what: str) -> dict[str, Any]:
    """A JSON object from a file; any decoding or parsing problem is a ValueError naming it."""
    try:
        value = json.loads(Path(path).read_bytes().decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path} is not a {what} (UTF-8 JSON): {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a {what}: expected a JSON object")
    return value


def _config_from(args: argparse.Namespace) -> PipelineConfig:
    values: dict[str, Any] = {}
    if args.config:
        values.update(_read_json_file(args.config, "pipeline config"))
    for config_field in dataclasses.fields(PipelineConfig):
        if hasattr(args, config_field.name):
            values[config_field.name] = getattr(args, config_field.name)
    return PipelineConfig.from_json(values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="venus-gym data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="data_command", required=True)
    all_parser = sub.add_parser("all", help="run every stage and write a report")
    all_parser.add_argument("inputs", nargs="+", help="input JSONL files")
    all_parser.add_argument("-o", "--out-dir", required=True, help="output directory")
    _add_config_options(all_parser)
    stage_help = {"convert": "DR-Venus messages JSON / our episodes -> Trajectory JSONL",
                  "prune": "remove calls to tools outside --tools, with their responses",
                  "dedup": "remove repeated tool interactions, with their responses",
                  "filter": "keep trajectories whose final answer the judge finds correct",
                  "resample": "turn-aware resampling (copies by turn count)"}
    for stage in STAGES:
        stage_parser = sub.add_parser(stage, help=stage_help[stage])
        stage_parser.add_argument("inputs", nargs="+", help="input JSONL files")
        stage_parser.add_argument("-o", "--output", required=True, help="output JSONL file")
        stage_parser.add_argument("--report", help="report JSON path (default: OUTPUT.report.json)")
        _add_config_options(stage_parser)
    report_parser = sub.add_parser("report", help="print a saved report.json, or the turn "
                                   "statistics of Trajectory JSONL files (first = before, "
                                   "last = after)")
    report_parser.add_argument("paths", nargs="+", help="report.json, or Trajectory JSONL files")
    report_parser.add_argument("--json", action="store_true", help="print JSON, not text")
    _add_config_options(report_parser)
    sub.add_parser("config-help", help="list every pipeline option with its help")
    return parser


def _summarize_files(paths: list[str], config: PipelineConfig) -> PipelineReport:
    """One "read" stage per file, so the report's before/after are the first and last file."""
    combined = PipelineReport(config=config.to_json(), inputs=paths)
    for path in paths:
        single = run_stages([path], [], {}, config, input_format=config.input_format)
        single.stages[0].stage = Path(path).name
        combined.stages.extend(single.stages)
        combined.bad_lines.extend(single.bad_lines)
        combined.seconds += single.seconds
    return combined


def _run(args: argparse.Namespace) -> int:
    command = args.data_command
    if command == "config-help":
        print(PipelineConfig.help())
        return 0
    config = _config_from(args)
    if command == "report":
        if len(args.paths) == 1 and args.paths[0].endswith(".json"):
            saved = _read_json_file(args.paths[0], "pipeline report")
            if not {"stages", "inputs", "bad_lines"} <= set(saved):
                raise ValueError(f"{args.paths[0]} is not a pipeline report (report.json)")
            print(json.dumps(saved, indent=2) if args.json else render_text(saved), end="\n")
            return 0
        report = _summarize_files(args.paths, config)
    elif command == "all":
        report = run_pipeline(args.inputs, args.out_dir, config)
        print(f"wrote {Path(args.out_dir) / 'report.json'} and report.txt")
    else:
        report = run_stages(args.inputs, [command], {command: Path(args.output)}, config)
        report_path = Path(args.report or f"{args.output}.report.json")
        report.write(report_path)
        print(f"wrote {args.output} and {report_path}")
    print(json.dumps(report.to_json(), indent=2) if getattr(args, "json", False)
          else report.to_text(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `venus-gym data`; returns the exit status (1 on bad data or judge failure)."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (DataFormatError, JudgeError, ValueError, OSError) as e:
        # OSError: a missing or unreadable input, an output directory that cannot be made.
        print(f"venus-gym data {args.data_command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
