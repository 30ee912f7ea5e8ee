"""`venus-gym eval` (trainers.evaluation.run, trainers.evaluation.report, trainers.evaluation.stats): the
statistics against hand-computed values, the four output files, resuming after an
interruption, the LLM judge and an endpoint policy against local stand-in servers."""

from __future__ import annotations

import json
import math
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from trainers.cli import main as cli_main
from trainers.engines.base import Engine, GenerationResult
from trainers.engines.sampling import sample_token
from trainers.evaluation.report import summarize
from trainers.evaluation.run import EvalRunConfig, read_finished, run_eval
from trainers.evaluation.stats import bootstrap_se, mean_pass_at_k, pass_at_k
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.sft.pipeline import build_chat
from trainers.trajectory import Trajectory, Turn

QA = [("What is the capital of France?", "Paris"), ("What is the capital of England?", "London"),
      ("What is the capital of Italy?", "Rome"), ("What is the capital of Spain?", "Madrid"),
      ("Which city hosts the Louvre?", "Paris")]


# --- statistics --------------------------------------------------------------------------
def test_pass_at_k_matches_hand_computed_values():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(8, 3, 2) == pytest.approx(1 - 10 / 28)
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k wrong samples: always a correct one
    assert pass_at_k(4, 0, 4) == 0.0
    assert mean_pass_at_k([(5, 2), (5, 0), (5, 5)], 2) == pytest.approx((0.7 + 0 + 1) / 3)
    for bad in ((3, 4, 1), (3, 1, 4), (3, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_bootstrap_se_is_seeded_and_matches_the_standard_error_of_a_mean():
    assert bootstrap_se([[0.5]] * 4) == 0.0  # no spread, no error
    clusters = [[0.0], [1.0], [1.0], [0.0], [1.0], [0.0], [0.0], [1.0]]
    first = bootstrap_se(clusters, samples=4000, seed=3)
    assert first == bootstrap_se(clusters, samples=4000, seed=3)
    # The bootstrap SE of a mean tends to sqrt(population variance / n) = sqrt(.25 / 8).
    assert first == pytest.approx(math.sqrt(0.25 / 8), rel=0.05)
    # Clustered: a task's samples move together, so the SE is that of the task means.
    assert bootstrap_se([[1.0, 1.0], [0.0, 0.0]], samples=4000, seed=0) == pytest.approx(
        math.sqrt(0.25 / 2), rel=0.05)
    assert bootstrap_se([[0.3]]) == 0.0


def _annotated(task_index: int, sample: int, correct: bool, hops: int, turns: int = 1,
               kind: str = "answer") -> Trajectory:
    turn_list = [Turn(kind="visit" if kind == "visit" else "search", valid=True,
                      assistant="x", env_reply="y") for _ in range(turns - 1)]
    turn_list.append(Turn(kind="answer", valid=True, assistant="a"))
    return Trajectory(id=f"t{task_index}/{sample}", messages=[], task_id=str(task_index),
                      answers=["a"], turns=turn_list, outcome=float(correct),
                      metadata={"eval": {"task_index": task_index, "sample": sample,
                                         "hops": hops, "type": None, "em": float(correct),
                                         "f1": float(correct), "tool_calls": turns - 1,
                                         "task_wall_s": 1.0}})


def test_summary_pass_at_k_and_breakdowns_match_hand_computed_values():
    # Three tasks, k = 3, with 0, 1 and 3 correct samples.
    correct = [[False] * 3, [True, False, False], [True] * 3]
    groups = [[_annotated(i, s, c, hops=1 + (i == 2)) for s, c in enumerate(row)]
              for i, row in enumerate(correct)]
    summary = summarize(groups, k=3, bootstrap_samples=200)
    assert summary["pass@1"] == pytest.approx((0 + 1 / 3 + 1) / 3)
    assert summary["pass@2"] == pytest.approx((0 + (1 - 1 / 3) + 1) / 3)  # 1 - C(2,2)/C(3,2)
    assert summary["pass@3"] == summary["pass@k"] == pytest.approx(2 / 3)
    assert summary["avg@k"] == pytest.approx(4 / 9) and summary["em"] == pytest.approx(4 / 9)
    assert summary["by_hops"]["1"]["tasks"] == 2 and summary["by_hops"]["2"]["pass@1"] == 1.0
    assert summary["by_hops"]["1"]["pass@1"] == pytest.approx(1 / 6)
    assert summary["pass@1_se"] > 0 and "by_type" not in summary
    with pytest.raises(ValueError, match="k=2"):
        summarize(groups, k=2)


def test_presence_penalty_changes_the_choice_not_the_reported_logprob():
    logits = torch.tensor([2.0, 1.5, 0.0])
    assert sample_token(logits) == sample_token(logits, presence_penalty=1.0)  # nothing seen
    token, logprob = sample_token(logits, presence_penalty=1.0, seen_ids=[0, 0])
    assert token == 1  # 2.0 - 1.0 < 1.5; the penalty is applied once per distinct id
    assert logprob == pytest.approx(float(torch.log_softmax(logits, -1)[1]))


# --- end to end ---------------------------------------------------------------------------
def write_qa(path, pairs=QA):
    with open(path, "w") as f:
        for i, (question, answer) in enumerate(pairs):
            f.write(json.dumps({"id": f"q{i}", "question": question, "answers": [answer],
                                "paragraphs": [{"title": answer, "is_supporting": True,
                                                "text": f"{answer} is the city in question."}]})
                    + "\n")
    return path


def tiny_chat():
    return build_chat(build_chatml_tokenizer(
        [q for q, _ in QA] + ["<think> search visit answer Paris London Rome"] * 5,
        vocab_size=400))


class Scripted(Engine):
    """Answers each task's gold answer or "Nowhere", by a coin seeded with the request's
    seed; raises KeyboardInterrupt at request `stop_at` (an interrupted evaluation)."""

    def __init__(self, chat, stop_at: int | None = None):
        self.chat = chat
        self.calls = 0
        self.stop_at = stop_at

    def generate(self, requests):
        results = []
        for request in requests:
            self.calls += 1
            if self.stop_at is not None and self.calls == self.stop_at:
                raise KeyboardInterrupt
            prompt = self.chat.tokenizer.decode(list(request.prompt_ids))
            gold = next(a for q, a in QA if q in prompt)
            coin = torch.Generator().manual_seed(request.seed)
            answer = gold if torch.rand(1, generator=coin).item() < 0.5 else "Nowhere"
            text = f"<think>I know it.</think>\n<answer>{answer}</answer>"
            ids = self.chat.tokenizer.encode(text, add_special_tokens=False)
            ids.append(self.chat.end_of_turn_id)
            results.append(GenerationResult(ids, [0.0] * len(ids), "stop"))
        return results


def config(tmp_path, out: str, **overrides) -> EvalRunConfig:
    values = {"out": str(tmp_path / out), "policy": "scripted", "k": 3,
              "benchmark": str(tmp_path / "qa.jsonl"), "max_turns": 2, "max_turn_tokens": 16,
              "bootstrap_samples": 100, **overrides}
    return EvalRunConfig(**values)


def without_timing(summary):
    return {key: value for key, value in summary.items() if "wall" not in key}


def test_an_interrupted_evaluation_resumes_to_the_same_summary(tmp_path):
    write_qa(tmp_path / "qa.jsonl")
    chat = tiny_chat()
    whole = run_eval(config(tmp_path, "whole"), policy=Scripted(chat), chat=chat,
                     progress=False, log=lambda _: None)
    assert whole["tasks"] == 5 and whole["trajectories"] == 15
    assert 0 < whole["pass@1"] < whole["pass@k"]  # the coin makes samples differ

    cut = config(tmp_path, "cut")
    with pytest.raises(KeyboardInterrupt):  # killed in task 2's second sample
        run_eval(cut, policy=Scripted(chat, stop_at=8), chat=chat, progress=False,
                 log=lambda _: None)
    results = tmp_path / "cut" / "results.jsonl"
    assert len(results.read_text().splitlines()) == 6  # tasks 0 and 1, three samples each
    with results.open("a") as f:
        f.write('{"id": "half a line')  # as a kill during a write leaves it
    resumed_policy = Scripted(chat)
    resumed = run_eval(cut, policy=resumed_policy, chat=chat, progress=False,
                       log=lambda _: None)
    assert resumed_policy.calls == 3 * 3  # only the three unfinished tasks were played
    assert without_timing(resumed) == without_timing(whole)
    lines = results.read_text().splitlines()
    assert len(lines) == 15 and sorted(read_finished(results, 3)) == [0, 1, 2, 3, 4]
    for name in ("summary.json", "report.md", "report.html", "accuracy_by_hops.png",
                 "browse_ratio.png", "turns_histogram.png"):
        assert (tmp_path / "cut" / name).stat().st_size > 0
    report = (tmp_path / "cut" / "report.md").read_text()
    assert "pass@3" in report and "![accuracy by hop count](accuracy_by_hops.png)" in report
    assert "data:image/png;base64," in (tmp_path / "cut" / "report.html").read_text()
    # Other settings on the same output directory are refused, not mixed in.
    with pytest.raises(ValueError, match="other settings.*temperature"):
        run_eval(config(tmp_path, "cut", temperature=0.3), policy=Scripted(chat), chat=chat,
                 progress=False, log=lambda _: None)


@contextmanager
def stand_in_server(handle):
    """A local HTTP server on 127.0.0.1 whose POST replies are handle(path, body) -> dict."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            data = json.dumps(handle(self.path, body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


def test_llm_judge_verdicts_and_malformed_replies_are_counted(tmp_path):
    write_qa(tmp_path / "qa.jsonl")
    chat = tiny_chat()
    replies = iter(["extracted_final_answer: x\nreasoning: same\ncorrect: yes\nconfidence: 90",
                    "reasoning: differs\ncorrect: no",
                    "I cannot grade this."] * 10)

    def grade(path, body):
        assert path == "/v1/chat/completions" and "[correct_answer]" in body["messages"][0][
            "content"]
        return {"choices": [{"message": {"role": "assistant", "content": next(replies)}}]}

    with stand_in_server(grade) as (url, seen):
        summary = run_eval(config(tmp_path, "judged", k=1, judge_endpoint=url,
                                  judge_retries=0), policy=Scripted(chat), chat=chat,
                           progress=False, log=lambda _: None)
    judge = summary["judge"]
    assert len(seen) == 5 and judge["judged"] == 4 and judge["errors"] == 1
    assert judge["pass@1"] == pytest.approx(2 / 5)  # yes, no, error, yes, no
    lines = [json.loads(x) for x in (tmp_path / "judged" / "results.jsonl").read_text()
             .splitlines()]
    assert lines[2]["metadata"]["eval"]["judge"]["error"].startswith("judge:")
    assert "LLM judge" in (tmp_path / "judged" / "report.md").read_text()


def test_cli_evaluates_a_saved_policy_and_an_endpoint(tmp_path, capsys):
    write_qa(tmp_path / "qa.jsonl", QA[:2])
    chat = tiny_chat()
    model = build_tiny_causal_lm(chat.tokenizer, hidden=32, layers=1, heads=1)
    model.save_pretrained(tmp_path / "policy")
    chat.tokenizer.save_pretrained(tmp_path / "policy")
    common = ["--benchmark", str(tmp_path / "qa.jsonl"), "--max-turns", "2",
              "--max-turn-tokens", "6", "--bootstrap-samples", "50"]
    assert cli_main(["eval", "--policy", str(tmp_path / "policy"), "--k", "2",
                     "--out", str(tmp_path / "local"), "--presence-penalty", "0.5",
                     "--save-token-ids", *common]) == 0
    assert "pass@1=" in capsys.readouterr().out
    lines = (tmp_path / "local" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["input_ids"]
    assert json.loads((tmp_path / "local" / "summary.json").read_text())["k"] == 2

    text = "<think>sure</think>\n<answer>Paris</answer>"
    ids = chat.tokenizer.encode(text, add_special_tokens=False) + [chat.end_of_turn_id]

    def complete(path, body):
        assert path == "/v1/completions" and isinstance(body["prompt"][0], int)
        return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.1] * len(ids)},
                             "finish_reason": "stop", "text": text}]}

    with stand_in_server(complete) as (url, seen):
        assert cli_main(["eval", "--endpoint", url, "--model", "m", "--tokenizer",
                         str(tmp_path / "policy"), "--out", str(tmp_path / "served"),
                         "--presence-penalty", "1.1", *common]) == 0
    assert seen and all(body["presence_penalty"] == 1.1 for body in seen)
    summary = json.loads((tmp_path / "served" / "summary.json").read_text())
    assert summary["pass@1"] == 0.5 and summary["em"] == 0.5  # Paris is right once
    assert cli_main(["eval", "--endpoint", url, "--out", str(tmp_path / "x"), *common]) == 2
    assert "--tokenizer" in capsys.readouterr().err
