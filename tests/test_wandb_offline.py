"""W&B for real, offline (WANDB_MODE=offline, every W&B directory under tmp_path): a 2-step
`venus-gym rl` run with `run.wandb_project` set on the command line leaves an offline run
whose transaction log holds the run's resolved config (the override included) and, per
step, the metric values the run wrote to metrics.jsonl."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import yaml

from trainers.cli import main as cli_main
from trainers.data.oracle_data import world_texts
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.run_log import read_metrics

wandb_internal = pytest.importorskip("wandb.proto.wandb_internal_pb2",
                                     reason="the wandb extra is not installed "
                                            "(pip install -e .[wandb])")

WORLD = {"world_size": 300, "world_seed": 3}
# W&B's transaction log (run-ID.wandb): a 7-byte file header, then LevelDB-log style
# records of protobuf `Record`s in 32 KiB blocks, each chunk with a 7-byte header
# (crc32, length, type: 1 full, 2 first, 3 middle, 4 last).
HEADER, CHUNK_HEADER, BLOCK = 7, 7, 32768


def read_transaction_log(path: Path) -> list:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, pending, position = [], b"", HEADER
    while position + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < CHUNK_HEADER:  # the block's tail is padding
            position += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + CHUNK_HEADER])
        position += CHUNK_HEADER
        chunk, position = data[position:position + length], position + length
        if kind in (1, 2):
            pending = chunk
        elif kind in (3, 4):
            pending += chunk
        else:
            continue
        if kind in (1, 4):
            record = wandb_internal.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


@pytest.fixture()
def offline_wandb(tmp_path, monkeypatch):
    home = tmp_path / "wandb-home"
    for variable, name in (("WANDB_DIR", "dir"), ("WANDB_CACHE_DIR", "cache"),
                           ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data"),
                           ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(variable, str(home / name))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return home


def write_small_rl_config(tmp_path: Path) -> Path:
    """The smallest RL run of tests/test_rl_driver.py, as a YAML file for `venus-gym rl`."""
    policy = tmp_path / "policy"
    tokenizer = build_chatml_tokenizer(world_texts(WORLD), vocab_size=2048)
    build_tiny_causal_lm(tokenizer, hidden=64, layers=2, heads=2, seed=0).save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    config = {
        "policy": {"path": str(policy), "threads": 1},
        "env": {"hops": [1], "search_top_k": 2, "max_turns": 3, "max_context_tokens": 1500,
                **WORLD},
        "rollout": {"group_size": 2, "queries_per_step": 2, "max_turn_tokens": 24,
                    "max_context_tokens": 2048},
        "algorithm": {"name": "igpo", "options": {"loss": {"entropy_coef": 0.01}}},
        "learner": {"lr": 1.0e-3, "micro_batch_size": 2},
        "eval": {"num_tasks": 1, "max_turn_tokens": 24, "before": False},
        "run": {"steps": 2, "output_dir": str(tmp_path / "run"), "progress_bar": False,
                "tensorboard": "off", "save_every": 0},
    }
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_an_offline_wandb_run_holds_the_config_and_the_logged_metrics(tmp_path, offline_wandb):
    config_path = write_small_rl_config(tmp_path)
    assert cli_main(["rl", "--config", str(config_path), "run.wandb_project=venus-gym-test",
                     "learner.lr=2e-3"]) == 0
    output = tmp_path / "run"
    logged_config = json.loads((output / "config.json").read_text())
    assert logged_config["learner"]["lr"] == 2e-3
    assert logged_config["run"]["wandb_project"] == "venus-gym-test"

    (run_dir,) = (output / "wandb").glob("offline-run-*")
    run_id = (output / "wandb_run_id.txt").read_text().strip()
    assert run_dir.name.endswith(f"-{run_id}")
    records = read_transaction_log(run_dir / f"run-{run_id}.wandb")

    # the config: every section as the run logged it (the override included)
    (run_record,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run_record.run_id == run_id and run_record.project == "venus-gym-test"
    wandb_config = {item.key: json.loads(item.value_json) for item in run_record.config.update
                    if not item.key.startswith("_")}
    assert wandb_config == logged_config

    # the metrics: per step, the finite values of metrics.jsonl (rows of a step merged)
    history: dict[int, dict[str, float]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = {item.key or ".".join(item.nested_key): json.loads(item.value_json)
                   for item in record.history.item}
            history.setdefault(row["_step"], {}).update(
                {k: v for k, v in row.items() if not k.startswith("_")})
    expected: dict[int, dict[str, float]] = {}
    for row in read_metrics(output / "metrics.jsonl"):
        values = {k: v for k, v in row.items() if k not in ("step", "time")
                  and isinstance(v, int | float) and math.isfinite(v)}
        expected.setdefault(row["step"], {}).update(values)
    assert sorted(history) == sorted(expected) == [0, 1]
    for step in expected:
        assert history[step].keys() == expected[step].keys()
        for key, value in expected[step].items():
            assert history[step][key] == pytest.approx(value, rel=1e-6, abs=1e-9), (step, key)
    assert {"reward", "kl", "grad_norm"} <= history[1].keys()
