"""The RL trainer on every kind of world: the packaged HotpotQA set, a MuSiQue slice served by
a local Search-R1 `/retrieve` server, the web backend replaying a recorded cache, and a
served model (rollout.engine: openai) with a plug-in algorithm loaded by the CLI.

A random tiny policy almost never writes a valid tool call, so these runs drive the turns
with a script (search the question, visit the first hit, answer): `ForcedHFEngine` runs the
real model and records its log-probs of the forced tokens, or a stand-in completions server
sends the script's token ids. What the tests prove is the plumbing: the configured world's
tasks are rolled out, its corpus (or server, or cache) answers the searches, and the scored
batch trains to finite metrics. They do not prove learning.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_eval_cli import stand_in_server
from tests.web_fixtures import COUNTRIES, FakeWeb, country_page
from trainers.algorithms import GRPO, make_algorithm
from trainers.cli import main as cli_main
from trainers.data.oracle_data import world_texts
from trainers.engines.scripted import chatml_user_messages
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm, load_tokenizer
from trainers.rl.config import RLConfig
from trainers.rl.driver import train
from venus_gym.tools.index import LocalSearchIndex
from venus_gym.tools.retrieval_server import RetrievalServerBackend, serve_index
from venus_gym.worlds import load_world

MUSIQUE = Path(__file__).parent / "data" / "musique_ans_dev_20.jsonl"
LINK = re.compile(r"\]\((http[^\s]+?)\)(?:\s|$)")
CAPITAL = re.compile(r"is (City\d+ville)")


def call(name: str, **arguments) -> str:
    return (f"<think>{name}</think>\n<tool_call>"
            f"{json.dumps({'name': name, 'arguments': arguments})}</tool_call>")


def respond(observations: list[str]) -> str:
    """Search the question, visit the first hit, answer what the page says (or 'unknown')."""
    if len(observations) == 1:
        return call("search", query=[observations[0][:120]])
    if len(observations) == 2:
        links = LINK.findall(observations[1])
        return call("visit", url=links[:1] or ["http://none.invalid/"], goal="the answer")
    found = CAPITAL.search(observations[-1])
    return f"<think>done</think>\n<answer>{found.group(1) if found else 'unknown'}</answer>"


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> str:
    """A random tiny policy whose tokenizer knows the text of every world used here."""
    directory = tmp_path_factory.mktemp("policy")
    texts = (world_texts({"world": "hotpotqa"})[:1500] + world_texts({"world": str(MUSIQUE)})
             + [country_page(i) for i in range(COUNTRIES)]
             + [call("search", query=["q"]), call("visit", url=["http://x"], goal="g")] * 50)
    tokenizer = build_chatml_tokenizer(texts, vocab_size=2048)
    model = build_tiny_causal_lm(tokenizer, hidden=64, layers=2, heads=2, seed=0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture()
def scripted_engines(monkeypatch):
    """Every HFEngine the run builds (rollout workers, held-out evaluation) plays `respond`
    through the real model's decode loop."""
    from trainers.engines import hf
    from trainers.engines.scripted import ForcedHFEngine

    def forced(model, tokenizer, **kwargs):
        return ForcedHFEngine(model, tokenizer, respond,
                              tokenizer.convert_tokens_to_ids("<|im_end|>"), **kwargs)

    monkeypatch.setattr(hf, "HFEngine", forced)


def small_config(policy_dir: str, output_dir: Path, **env) -> RLConfig:
    config = RLConfig()
    config.policy.path, config.policy.threads = policy_dir, 1
    config.env = dataclasses.replace(config.env, hops=None, search_top_k=2, max_turns=3,
                                     max_context_tokens=3000, **env)
    config.rollout = dataclasses.replace(config.rollout, group_size=2, queries_per_step=2,
                                         max_turn_tokens=200, max_context_tokens=4096)
    config.algorithm.name = "grpo"
    # Script answers are often wrong alike, so advantages may all be 0; the entropy bonus
    # gives every step a gradient.
    config.algorithm.options = {"loss": {"entropy_coef": 0.01}}
    config.learner = dataclasses.replace(config.learner, lr=1e-3, micro_batch_size=2)
    config.eval = dataclasses.replace(config.eval, num_tasks=1, max_turn_tokens=200)
    config.run = dataclasses.replace(config.run, steps=2, output_dir=str(output_dir),
                                     progress_bar=False, tensorboard="off", save_every=0)
    return config


def search_replies(result) -> list[str]:
    replies = [t.turns[0].env_reply for step in result.trajectories for t in step]
    assert replies and all(t.turns[0].kind == "search" for step in result.trajectories
                           for t in step)
    return replies


def assert_finite(result) -> None:
    """The update's numbers are finite (some diagnostics are NaN by design when their subset
    is empty, e.g. browse_ratio_correct with no correct answer: trainers.run_log)."""
    assert len(result.history) == 2
    for metrics in result.history:
        for key in ("policy_loss", "grad_norm", "entropy", "kl", "reward", "lr",
                    "mean_tokens"):
            assert math.isfinite(metrics[key]), (key, metrics)
        assert metrics["grad_norm"] > 0  # the batch trained the policy
    assert math.isfinite(result.after["accuracy"])


def test_rl_trains_two_steps_on_the_packaged_hotpotqa_set(tmp_path, policy_dir,
                                                          scripted_engines):
    config = small_config(policy_dir, tmp_path / "run", world="hotpotqa")
    result = train(config, keep_trajectories=True)
    assert_finite(result)
    world = load_world("hotpotqa")
    titles = {page.title for page in world.corpus}
    questions = {task.id: task.question for task in world.tasks}
    for step in result.trajectories:
        for trajectory in step:
            assert trajectory.question == questions[trajectory.task_id]
    # Every search was answered from the HotpotQA corpus: its hits name HotpotQA titles.
    for reply in search_replies(result):
        assert any(f"[{title}]" in reply for title in titles), reply[:300]
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["after"]


class CountingIndex(LocalSearchIndex):
    """The server's index, listing the queries it answered."""

    queries: list[str] = []

    def search_pages(self, query, k):
        self.queries.append(query)
        return super().search_pages(query, k)


def test_rl_trains_two_steps_on_musique_served_by_a_local_retrieve_server(
        tmp_path, policy_dir, scripted_engines):
    world = load_world(MUSIQUE)
    index = CountingIndex(world.corpus)
    index.queries = []
    server, _, url = serve_index(index, host="127.0.0.1")
    try:
        config = small_config(policy_dir, tmp_path / "run", world=str(MUSIQUE),
                              search_backend="retrieval_server", retrieval_url=url)
        result = train(config, keep_trajectories=True)
    finally:
        server.shutdown()
        server.server_close()
    assert_finite(result)
    questions = {task.id: task.question for task in world.tasks}
    rolled = [t for step in result.trajectories for t in step]
    assert all(t.question == questions[t.task_id] for t in rolled)
    # The server answered every search: one query per rollout's search turn (plus the
    # held-out evaluation's), each a MuSiQue question.
    assert len(index.queries) >= len(rolled)
    assert {q for q in index.queries} <= {q[:120] for q in questions.values()}
    titles = {page.title for page in world.corpus}
    for reply in search_replies(result):
        assert any(f"[{title}]" in reply for title in titles), reply[:300]


def test_rl_step_on_the_web_backend_replays_a_recorded_cache(tmp_path, policy_dir,
                                                             scripted_engines):
    """Recorded against a fake web on 127.0.0.1, replayed with the web shut down: the RL
    run's trajectories and rewards are identical token for token."""
    web = FakeWeb()
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": f"c{i}", "question": f"What is the capital of "
                                      f"Country {i}?", "answers": [f"City{i}ville"]}) + "\n"
                          for i in range(COUNTRIES)))
    env = dict(world=str(qa), backend="web", search_provider="searxng",
               search_url=web.url + "/searxng", allow_hosts=(f"127.0.0.1:{web.port}",),
               tool_retries=0, cache_path=str(tmp_path / "web.sqlite"), prompt_style="compact")
    try:
        recorded = train(small_config(policy_dir, tmp_path / "record", cache_mode="record",
                                      **env), keep_trajectories=True)
    finally:
        web.close()
    replayed = train(small_config(policy_dir, tmp_path / "replay", cache_mode="replay", **env),
                     keep_trajectories=True)
    assert_finite(replayed)
    for a_step, b_step in zip(recorded.trajectories, replayed.trajectories, strict=True):
        for a, b in zip(a_step, b_step, strict=True):
            assert [turn.kind for turn in b.turns] == ["search", "visit", "answer"]
            assert a.input_ids == b.input_ids and a.outcome == b.outcome
            assert "City" in b.turns[1].env_reply  # the visited page, from the cache
    assert [h["reward"] for h in recorded.history] == [h["reward"] for h in replayed.history]
    assert any(h["reward"] > 0 for h in replayed.history)  # the script reads the answers


def test_search_service_serves_the_configured_world():
    from trainers.rl.rollout_worker import SearchService

    config = RLConfig()
    config.env = dataclasses.replace(config.env, world="hotpotqa")
    service = SearchService(config.env.kwargs(), host="127.0.0.1")
    try:
        task = load_world("hotpotqa").tasks[0]
        hits = RetrievalServerBackend(service.url()).search(task.question, 3)
    finally:
        service.close()
    titles = {page.title for page in load_world("hotpotqa").corpus}
    assert service.world_name == "hotpotqa" and hits and all(h.title in titles for h in hits)


PLUGIN = '''
from trainers.algorithms import GRPO, Advantages


class HalfGRPO(GRPO):
    """GRPO with advantages halved (a plug-in outside the package)."""

    def advantages(self, batch, rewards):
        tokens, metrics = super().advantages(batch, rewards)
        return Advantages(tokens * 0.5, {**metrics, "half": 1.0})


NOT_AN_ALGORITHM = 3
'''


@pytest.fixture()
def plugin_module(tmp_path, monkeypatch):
    name = f"venus_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_plugin_algorithms_load_by_module_path_with_clear_errors(plugin_module):
    algorithm = make_algorithm(f"{plugin_module}:HalfGRPO")
    assert isinstance(algorithm, GRPO) and type(algorithm).__name__ == "HalfGRPO"
    config = RLConfig()
    config.algorithm.name = f"{plugin_module}:HalfGRPO"
    config.algorithm.options = {"loss": {"entropy_coef": 0.01}}
    assert config.algorithm.build().config.loss.entropy_coef == 0.01
    with pytest.raises(KeyError, match="cannot import module 'no_such_module_xyz'"):
        make_algorithm("no_such_module_xyz:Algo")
    with pytest.raises(KeyError, match="has no 'Missing'.*HalfGRPO"):
        make_algorithm(f"{plugin_module}:Missing")
    with pytest.raises(KeyError, match="not a subclass"):
        make_algorithm(f"{plugin_module}:NOT_AN_ALGORITHM")
    with pytest.raises(KeyError, match="package.module:ClassName"):
        make_algorithm("no_such_algorithm")


def test_openai_rollout_engine_is_a_fixed_policy_only_when_asked(policy_dir):
    config = RLConfig()
    config.policy.path = policy_dir
    config.rollout.engine = "openai"
    with pytest.raises(ValueError, match="openai_url"):
        config.validate()
    config.rollout.openai_url = "http://127.0.0.1:1/v1"
    with pytest.raises(ValueError, match="sync_weights: false"):
        config.validate()
    config.rollout.sync_weights = False
    config.validate()


def test_cli_rl_with_world_flag_plugin_algorithm_and_an_openai_engine(
        tmp_path, policy_dir, plugin_module, capsys):
    """`venus-gym rl --world hotpotqa --algorithm module:Class` with rollouts from a stand-in
    completions server that plays the script in the policy's token ids."""
    tokenizer, chat = load_tokenizer(policy_dir)

    def complete(path, body):
        assert path == "/v1/completions" and isinstance(body["prompt"][0], int)
        prompt = tokenizer.decode(body["prompt"], skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)
        text = respond(chatml_user_messages(prompt))
        ids = tokenizer.encode(text, add_special_tokens=False) + [chat.end_of_turn_id]
        return {"choices": [{"token_ids": ids, "text": text, "finish_reason": "stop",
                             "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]}

    config = dataclasses.asdict(small_config(policy_dir, tmp_path / "run"))
    config["rollout"].update(engine="openai", sync_weights=False, openai_model="policy")
    config["eval"]["before"] = False
    with stand_in_server(complete) as (url, seen):
        config["rollout"]["openai_url"] = url
        path = tmp_path / "rl.yaml"
        path.write_text(yaml.safe_dump(json.loads(json.dumps(config))))
        assert cli_main(["rl", "--config", str(path), "--world", "hotpotqa",
                         "--algorithm", f"{plugin_module}:HalfGRPO"]) == 0
    assert "report:" in capsys.readouterr().out
    assert len(seen) >= 2 * 2 * 2  # 2 steps x 2 groups x 2 rollouts, a search turn each
    titles = {page.title for page in load_world("hotpotqa").corpus}
    samples = [json.loads(line) for sample in sorted((tmp_path / "run" / "samples").iterdir())
               for line in sample.read_text().splitlines()]
    replies = [m["content"] for s in samples for m in s["messages"] if m["role"] == "user"][1:]
    assert any(f"[{title}]" in reply for reply in replies for title in titles)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl")
               .read_text().splitlines()]
    assert len(metrics) == 2 and all(m.get("half") == 1.0 for m in metrics)


def test_world_url_refused_with_the_fix():
    from trainers.config_utils import EnvSection

    with pytest.raises(ValueError, match="search_backend: retrieval_server"):
        EnvSection(world="http://127.0.0.1:8000/retrieve")


def test_splits_partition_the_tasks_and_validation_leaves_test_alone():
    import gymnasium as gym

    import envs  # noqa: F401

    def ids(**kwargs):
        env = gym.make("DeepResearch-v0", world="hotpotqa", **kwargs).unwrapped
        return {task.id for task in env.tasks}

    every = ids()
    test, train_only = ids(task_split="test"), ids(task_split="train")
    validation = ids(task_split="validation", validation_fraction=0.1)
    train_rest = ids(task_split="train", validation_fraction=0.1)
    assert ids(task_split="test", validation_fraction=0.1) == test
    assert validation and train_rest | validation == train_only
    assert not (validation & train_rest) and not (test & train_only)
    assert test | train_only == every
    with pytest.raises(ValueError, match="validation_fraction > 0"):
        ids(task_split="validation")


def test_sft_config_refuses_world_settings_that_cannot_apply():
    from trainers.config_utils import EnvSection
    from trainers.sft.config import DataConfig, EvalConfig, SFTExperimentConfig

    with pytest.raises(ValueError, match="remove data.world_seeds"):
        SFTExperimentConfig(data=DataConfig(world_seeds=(1, 2)),
                            env=EnvSection(world="hotpotqa"))
    with pytest.raises(ValueError, match="remove it"):
        SFTExperimentConfig(eval=EvalConfig(world_seed=3), env=EnvSection(world="hotpotqa"))
    with pytest.raises(ValueError, match="oracle"):
        SFTExperimentConfig(env=EnvSection(backend="web", search_provider="searxng",
                                           search_url="http://127.0.0.1:1"))
    SFTExperimentConfig(env=EnvSection(world="hotpotqa"))  # the oracle plays QA worlds


def test_sft_world_tokenizer_learns_the_configured_world(monkeypatch):
    from trainers.sft import pipeline
    from trainers.sft.config import ModelConfig

    seen = []
    monkeypatch.setattr(pipeline, "world_texts",
                        lambda kwargs: seen.append(kwargs) or ["some text"] * 10)
    pipeline._world_tokenizer.cache_clear()
    pipeline.build_tokenizer(ModelConfig(vocab_size=300), {"world": "hotpotqa"})
    assert seen == [{"world": "hotpotqa"}]
    pipeline._world_tokenizer.cache_clear()


def test_eval_world_flag_is_the_benchmark_option():
    import argparse

    from trainers.evaluation.run import add_arguments, benchmark_env_kwargs, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--policy", "p", "--out", "o", "--world", "hotpotqa",
                              "--split", "test"])
    config = config_from_args(args)
    assert config.benchmark == "hotpotqa"
    _, split = benchmark_env_kwargs(config)
    assert split == "test"
    assert parser.parse_args(["--out", "o", "--benchmark", "synthetic"]).benchmark == "synthetic"

