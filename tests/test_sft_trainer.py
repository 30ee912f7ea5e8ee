"""SFT trainer: exact resume, accumulation invariance, schedule, configs, logging."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
import yaml

from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.sft.config import (
    DataConfig,
    SFTExperimentConfig,
    TrainConfig,
    config_to_dict,
    field_help,
    load_config,
)
from trainers.sft.packing import SFTSample
from trainers.sft.trainer import SFTTrainer, latest_checkpoint, warmup_cosine


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_tokenizer(["the city of the river and the mayor of it"] * 20,
                                  vocab_size=300)


def make_samples(vocab: int, count: int = 24, seed: int = 0) -> list[SFTSample]:
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        size = rng.randrange(6, 40)
        ids = tuple(rng.randrange(3, vocab) for _ in range(size))
        mask = tuple([0, 0, 0] + [int(rng.random() < 0.6) for _ in range(size - 3)])
        samples.append(SFTSample(ids, mask))
    return samples


def make_trainer(tokenizer, tmp_path, samples, **train_overrides):
    rows = train_overrides.pop("rows", 1)
    settings = {"lr": 3e-3, "output_dir": str(tmp_path), "progress_bar": False,
                "log_every": 1000, "max_steps": 6, **train_overrides}
    train = TrainConfig(**settings)
    data = DataConfig(max_seq_len=64, rows_per_micro_batch=rows)
    model = build_tiny_causal_lm(tokenizer, hidden=64, layers=2, seed=0).train()
    return SFTTrainer(model, samples, train, data, tokenizer.pad_token_id, log=lambda _: None)


def parameters(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_resume_matches_uninterrupted_run(tokenizer, tmp_path):
    samples = make_samples(len(tokenizer))
    full = make_trainer(tokenizer, tmp_path / "full", samples, max_steps=6, grad_accum=2)
    full_history = full.train()

    first = make_trainer(tokenizer, tmp_path / "part", samples, max_steps=6, grad_accum=2)
    first.train(max_steps=3)
    checkpoint = first.save_checkpoint()
    assert latest_checkpoint(tmp_path / "part") == checkpoint
    resumed = make_trainer(tokenizer, tmp_path / "part", samples, max_steps=6, grad_accum=2,
                           seed=0)
    torch.manual_seed(1234)  # a different global RNG state must not matter after loading
    resumed.load_checkpoint(checkpoint)
    resumed_history = resumed.train()
    assert [m["loss"] for m in full_history[3:]] == [m["loss"] for m in resumed_history]
    assert [m["lr"] for m in full_history[3:]] == [m["lr"] for m in resumed_history]
    expected, actual = parameters(full), parameters(resumed)
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4, 5, 6]


def test_resume_after_a_kill_ignores_a_partial_checkpoint_and_replayed_metrics(
        tokenizer, tmp_path):
    """A run killed after step 5 (checkpoints at 2 and 4, metrics up to 5, a torn metrics
    line and a scratch directory of a save cut short) resumes from checkpoint 4: the
    scratch directory is never taken for a checkpoint and is removed, steps 5-6 run again
    and are logged once, and the run ends as the uninterrupted one."""
    samples = make_samples(len(tokenizer))
    full = make_trainer(tokenizer, tmp_path / "full", samples, save_every=2)
    full.train()
    killed = make_trainer(tokenizer, tmp_path / "part", samples, save_every=2)
    killed.train(max_steps=5)
    scratch = tmp_path / "part" / ".checkpoint-0000006.tmp-1-abcd"
    scratch.mkdir()
    (scratch / "trainer_state.pt").write_bytes(b"torn")  # a torch.save cut short
    with (tmp_path / "part" / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 6, "lo')
    checkpoint = latest_checkpoint(tmp_path / "part")
    assert checkpoint.name == "checkpoint-0000004"
    resumed = make_trainer(tokenizer, tmp_path / "part", samples, save_every=2)
    with pytest.warns(RuntimeWarning, match="unreadable last line"):
        resumed.load_checkpoint(checkpoint)
    resumed.train()
    assert not scratch.exists()
    expected, actual = parameters(full), parameters(resumed)
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    rows = [json.loads(line) for line in
            (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    reference = [json.loads(line) for line in
                 (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    timing = {"tokens_per_s", "step_time_s", "time"}
    assert [{k: v for k, v in row.items() if k not in timing} for row in rows] == \
        [{k: v for k, v in row.items() if k not in timing} for row in reference]
    assert latest_checkpoint(tmp_path / "part").name == "checkpoint-0000006"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device "
                    "(benchmarks/gpu_checks.sh runs it on a GPU machine)")
def test_resume_on_a_gpu_matches_uninterrupted_run(tokenizer, tmp_path):
    """The checkpoint holds CUDA RNG states; loading maps them to the GPU, where the CUDA
    generator refuses them unless they go back to the CPU first. GPU kernels need not be
    bitwise deterministic, so losses are compared with a tolerance."""
    samples = make_samples(len(tokenizer))

    def on_gpu(directory):
        train = TrainConfig(lr=3e-3, output_dir=str(directory), progress_bar=False,
                            log_every=1000, max_steps=4)
        model = build_tiny_causal_lm(tokenizer, hidden=64, layers=2, seed=0).cuda().train()
        return SFTTrainer(model, samples, train, DataConfig(max_seq_len=64),
                          tokenizer.pad_token_id, log=lambda _: None)

    full_history = on_gpu(tmp_path / "full").train()
    first = on_gpu(tmp_path / "part")
    first.train(max_steps=2)
    checkpoint = first.save_checkpoint()
    resumed = on_gpu(tmp_path / "part")
    resumed.load_checkpoint(checkpoint)
    resumed_history = resumed.train()
    assert resumed.step == 4
    assert [m["loss"] for m in resumed_history] == pytest.approx(
        [m["loss"] for m in full_history[2:]], rel=1e-4)


def test_accumulation_matches_one_big_batch(tokenizer, tmp_path):
    samples = make_samples(len(tokenizer), seed=1)
    accumulated = make_trainer(tokenizer, tmp_path / "a", samples, max_steps=3, grad_accum=4)
    big = make_trainer(tokenizer, tmp_path / "b", samples, max_steps=3, grad_accum=1, rows=4)
    a, b = accumulated.train(), big.train()
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
    # Same gradient up to float summation order; Adam's normalised update can turn such
    # rounding into lr-relative differences, so compare against how far training moved.
    initial = build_tiny_causal_lm(tokenizer, hidden=64, layers=2, seed=0).state_dict()
    for name, value in parameters(accumulated).items():
        reference = parameters(big)[name]
        moved = float((reference - initial[name]).abs().max())
        assert float((value - reference).abs().max()) <= 1e-2 * max(moved, 1e-6), name


def test_warmup_then_cosine():
    total = 100
    values = [warmup_cosine(step, total, 0.1, 0.0) for step in range(total)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(x >= y for x, y in zip(values[9:], values[10:]))
    assert values[-1] < 0.01
    assert warmup_cosine(55, total, 0.1, 0.2) == pytest.approx(0.2 + 0.8 * 0.5)
    assert not math.isnan(warmup_cosine(0, 1, 0.0, 0.0))


def _step_seconds(monkeypatch, trainer, seconds_of_step):
    """A fake clock that a step of `trainer` advances by seconds_of_step(step index) (and
    every reading by a microsecond, so a step's own timing is never zero)."""
    clock = [0.0]

    def perf_counter():
        clock[0] += 1e-6
        return clock[0]

    monkeypatch.setattr("trainers.sft.trainer.time.perf_counter", perf_counter)
    real_step = trainer.train_step

    def timed_step():
        clock[0] += seconds_of_step(trainer.step)
        return real_step()

    monkeypatch.setattr(trainer, "train_step", timed_step)


def test_a_time_budget_replans_the_schedule_to_end_when_the_time_does(tokenizer, tmp_path,
                                                                       monkeypatch):
    trainer = make_trainer(tokenizer, tmp_path, make_samples(len(tokenizer)), max_steps=100,
                           max_seconds=10.5, warmup_ratio=0.1)
    _step_seconds(monkeypatch, trainer, lambda step: 1.0)
    history = trainer.train()
    # 4 steps measured at 1 s: 6.5 s left fit 6 more, so the run is 10 steps long and its
    # cosine (which reads total_steps) reaches its end at step 10, not at step 100.
    assert len(history) == 10 and trainer.total_steps == 10
    assert history[-1]["lr"] == pytest.approx(3e-3 * warmup_cosine(9, 10, 0.1, 0.0))
    assert history[-1]["lr"] < 0.05 * 3e-3


def test_a_time_budget_stops_the_loop_when_later_steps_run_slower(tokenizer, tmp_path,
                                                                  monkeypatch):
    trainer = make_trainer(tokenizer, tmp_path, make_samples(len(tokenizer)), max_steps=100,
                           max_seconds=10.5)
    _step_seconds(monkeypatch, trainer, lambda step: 1.0 if step < 4 else 3.0)
    history = trainer.train()
    # planned for 10 steps at 1 s; at 3 s a step the budget is spent after step 7 (13 s).
    assert trainer.total_steps == 10 and len(history) == 7


def test_a_time_budget_longer_than_the_run_changes_nothing(tokenizer, tmp_path, monkeypatch):
    samples = make_samples(len(tokenizer))
    budgeted = make_trainer(tokenizer, tmp_path / "a", samples, max_steps=6, max_seconds=1000)
    _step_seconds(monkeypatch, budgeted, lambda step: 1.0)
    plain = make_trainer(tokenizer, tmp_path / "b", samples, max_steps=6)
    assert [m["lr"] for m in budgeted.train()] == [m["lr"] for m in plain.train()]
    assert budgeted.total_steps == 6


@pytest.mark.parametrize("settings, message", [
    ({"max_seconds": -1.0}, "max_seconds must be >= 0"),
    ({"max_seconds": float("nan")}, "max_seconds must be >= 0"),
    ({"max_seconds": 60.0, "num_workers": 2}, "max_seconds needs train.num_workers == 1")])
def test_a_bad_time_budget_is_refused_with_the_reason(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


@pytest.mark.parametrize("options", [{"precision": "bf16"}, {"gradient_checkpointing": True},
                                     {"logits_on_trained_positions_only": False}])
def test_options_train_and_reduce_loss(tokenizer, tmp_path, options):
    samples = make_samples(len(tokenizer), count=4, seed=2)
    trainer = make_trainer(tokenizer, tmp_path, samples, max_steps=12, warmup_ratio=0.0,
                           lr=1e-2, epochs=1, **options)
    history = trainer.train()
    assert history[-1]["loss"] < history[0]["loss"]
    assert all(math.isfinite(m["grad_norm"]) and m["tokens_per_s"] > 0 for m in history)


@pytest.mark.parametrize("boolean_logits_to_keep", [True, False])
@pytest.mark.parametrize("rows", [1, 3])
def test_trained_positions_only_gives_same_loss(tokenizer, tmp_path, rows,
                                                boolean_logits_to_keep, monkeypatch):
    """Both forms of logits_to_keep (the [B, L] boolean of transformers >= 5.20 and the 1-D
    index older 5.x take) give the full forward's loss, also with several rows."""
    from trainers.sft import trainer as trainer_module

    if boolean_logits_to_keep and not trainer_module.BOOLEAN_LOGITS_TO_KEEP:
        pytest.skip("this transformers has no boolean logits_to_keep")
    monkeypatch.setattr(trainer_module, "BOOLEAN_LOGITS_TO_KEEP", boolean_logits_to_keep)
    samples = make_samples(len(tokenizer), seed=3)
    fast = make_trainer(tokenizer, tmp_path / "f", samples, max_steps=2, rows=rows)
    full = make_trainer(tokenizer, tmp_path / "g", samples, max_steps=2, rows=rows,
                        logits_on_trained_positions_only=False)
    for x, y in zip(fast.train(), full.train()):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-6)


def test_yaml_config_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# python something\ntrain:\n  lr: 0.001\n  betas: [0.9, 0.99]\n"
                    "env:\n  hops: [1, 2]\n")
    config = load_config(path)
    assert isinstance(config, SFTExperimentConfig)
    assert config.train.lr == 0.001 and config.train.betas == (0.9, 0.99)
    assert config.env.hops == (1, 2) and config.train.weight_decay == 0.01
    assert json.dumps(config_to_dict(config))
    assert all(text for text in field_help(TrainConfig).values())
    path.write_text("train:\n  learning_rate: 0.1\n")
    with pytest.raises(ValueError, match="learning_rate"):
        load_config(path)
    path.write_text("train:\n  betas: [0.9]\n")  # list items are checked like fields
    with pytest.raises(ValueError, match=r"train.betas must have 2 items, got \[0.9\]"):
        load_config(path)
    path.write_text("env:\n  hops: [1, two]\n")
    with pytest.raises(ValueError, match=r"env.hops\[1\] must be int, got 'two'"):
        load_config(path)


REPO = Path(__file__).resolve().parents[1]


def sft_config_paths() -> list[Path]:
    """Every SFT config the repository ships (examples/configs) or records (experiments/):
    the files that have no RL `rollout` section."""
    paths = sorted(path for folder in ("examples/configs", "experiments/configs")
                   for path in (REPO / folder).glob("*.yaml"))
    return [path for path in paths if "rollout" not in (yaml.safe_load(path.read_text()) or {})]


SFT_CONFIGS = sft_config_paths()


@pytest.mark.parametrize("path", SFT_CONFIGS, ids=lambda path: path.relative_to(REPO).as_posix())
def test_every_sft_config_loads_and_names_its_command_first(path):
    first_line = path.read_text().splitlines()[0]
    own = path.relative_to(REPO).as_posix()
    assert first_line.startswith("# ") and (f"--config {own}" in first_line
                                            or first_line.startswith("# venus-gym demo")), (
        f"{own}: line 1 must be the command that runs it, got {first_line!r}")
    load_config(path)


def test_chained_passes_continue_their_parent_and_keep_off_held_out_worlds():
    """A config whose model is another config's `<output_dir>/final` is a later pass of a
    chain (the SFT command runs several configs in order). Each such pass starts from its
    parent's final model and tokenizer, skips the induction warm-up, is trained with the
    parent's environment (prompt, world settings), and does not repeat the parent's data in
    the same order. No config trains on a world that any config evaluates on (the test
    world and the validation worlds), and a pass on new worlds uses none its ancestors used."""
    configs = {path.relative_to(REPO).as_posix(): load_config(path) for path in SFT_CONFIGS}
    by_final = {f"{config.train.output_dir}/final": name for name, config in configs.items()}
    held_out = {config.env.world_seed for config in configs.values()} | {
        config.eval.world_seed for config in configs.values() if config.eval.world_seed >= 0}
    chained = 0
    for name, config in configs.items():
        worlds = set(config.data.world_seeds)
        assert not worlds & held_out, f"{name} trains on held-out worlds {worlds & held_out}"
        parent_name = by_final.get(config.model.name)
        if parent_name is None:
            continue
        chained += 1
        parent = configs[parent_name]
        assert config.model.tokenizer == config.model.name, name
        assert config.train.induction_warmup_steps == 0, name
        assert config.env == parent.env, name
        assert (config.data.seed, config.train.seed, worlds) != (
            parent.data.seed, parent.train.seed, set(parent.data.world_seeds)), name
        ancestor_worlds: set[int] = set()
        while parent_name is not None:
            ancestor_worlds |= set(configs[parent_name].data.world_seeds)
            parent_name = by_final.get(configs[parent_name].model.name)
        assert not worlds & ancestor_worlds or worlds == set(parent.data.world_seeds), (
            f"{name} reuses some, not all, of its ancestors' worlds")
    assert chained, "no chained SFT configs found: nothing was checked"


def test_device_setting_resolves_or_names_the_problem(monkeypatch):
    from trainers.modeling.models import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="train.device is 'cuda:0' but torch sees no CUDA"):
        resolve_device("cuda:0", "train.device")
    with pytest.raises(ValueError, match="train.device must be .*'gpu0'"):
        resolve_device("gpu0", "train.device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_eval_world_seed_moves_only_the_evaluation():
    """A validation world (eval.world_seed) changes the world that evaluation plays, never
    the one the tokenizer and the training data are built from."""
    config = SFTExperimentConfig()
    config.env.world_seed, config.eval.max_turns = 0, 7
    assert config.eval_env_kwargs() == {**config.env_kwargs(), "max_turns": 7}
    config.eval.world_seed = 45
    assert config.eval_env_kwargs()["world_seed"] == 45
    assert config.env_kwargs()["world_seed"] == 0


def test_varlen_training_never_builds_the_dense_packed_mask(tokenizer, tmp_path, monkeypatch):
    """A packed row's dense mask is [B, 1, L, L] (64M entries at 8K tokens): varlen attention
    must not pay for it, and the 'mask' mode builds it where the model runs."""
    from trainers.sft import packing

    built_on = []
    original = packing.Batch.attention_mask_on

    def spy(self, device):
        built_on.append(torch.device(device))
        return original(self, device)

    monkeypatch.setattr(packing.Batch, "attention_mask_on", spy)
    samples = make_samples(len(tokenizer), seed=5)
    make_trainer(tokenizer, tmp_path / "v", samples, max_steps=2).train()
    assert built_on == []
    trainer = make_trainer(tokenizer, tmp_path / "m", samples, max_steps=2)
    trainer.data_cfg.packed_attention = "mask"
    trainer.train()
    assert built_on and all(device == trainer.device for device in built_on)


@pytest.mark.parametrize("workers", [-1, True])
def test_bad_data_workers_are_refused_at_load(workers):
    with pytest.raises(ValueError, match="data.workers must be an int >= 0"):
        DataConfig(workers=workers)


@pytest.mark.parametrize("value", [-0.5, float("nan")])
def test_a_negative_or_nan_warmup_target_is_refused(value):
    with pytest.raises(ValueError, match="induction_warmup_target_loss must be >= 0"):
        TrainConfig(induction_warmup_target_loss=value)


def test_a_warmup_target_needs_a_warmup_as_long_as_its_window():
    from trainers.sft.warmup import TARGET_WINDOW

    for steps in (0, TARGET_WINDOW - 1):  # 0: no warm-up would run, the target be ignored
        with pytest.raises(ValueError, match="induction_warmup_steps must be >= 10"):
            TrainConfig(induction_warmup_target_loss=1.0, induction_warmup_steps=steps)
    TrainConfig(induction_warmup_target_loss=1.0, induction_warmup_steps=TARGET_WINDOW)


def test_env_sections_are_the_environments_own_settings():
    """The SFT and RL env sections are envs.config.DeepResearchConfig: every env keyword, the
    env's help strings and validation, and kwargs() the env accepts."""
    from envs.config import DeepResearchConfig
    from trainers.config_utils import field_help, from_dict
    from trainers.rl.config import EnvSettings
    from trainers.sft.config import EnvConfig

    env_help = field_help(DeepResearchConfig)
    for section in (EnvConfig, EnvSettings):
        assert {k: v for k, v in field_help(section).items() if k in env_help} == env_help
        kwargs = section().kwargs()
        assert set(kwargs) == set(env_help)
        assert DeepResearchConfig.from_kwargs(**kwargs).hops == (1, 2)
        with pytest.raises(ValueError, match="reward_metric must be 'em' or 'f1'"):
            from_dict(section, {"reward_metric": "bleu"}, where="env")
    settings = from_dict(EnvSettings, {"hops": [1], "tool_timeout_s": 5}, where="env")
    assert settings.kwargs()["hops"] == (1,) and settings.tool_timeout_s == 5.0
    assert from_dict(EnvSettings, {"tool_timeout_s": None}, where="env").tool_timeout_s is None


def test_scientific_notation_without_a_dot_reads_as_a_number(tmp_path):
    """PyYAML (YAML 1.1) reads `lr: 5e-5` as the string "5e-5"; configs read it as 5e-05,
    and a word in a float field is still refused."""
    from trainers.rl.config import load_rl_config

    path = tmp_path / "c.yaml"
    path.write_text("model:\n  name: tiny\ntrain:\n  lr: 5e-5\n  output_dir: out\n")
    assert load_config(path).train.lr == 5e-5
    path.write_text("policy:\n  path: p\nlearner:\n  lr: 1E-6\n")
    assert load_rl_config(path).learner.lr == 1e-6
    path.write_text("model:\n  name: tiny\ntrain:\n  lr: fast\n")
    with pytest.raises(ValueError, match="lr must be float, got 'fast'"):
        load_config(path)
