"""Stage 4 of the SFT data pipeline: keep only trajectories whose final answer is correct.

A `Judge` turns (question, prediction, gold answers) into a `Verdict`. Two are provided:

* `MetricJudge(metric="em" | "f1", threshold)`: `venus_gym.scoring` (SQuAD normalisation,
  max over golds); correct when score >= threshold. Offline and deterministic.
* `LLMJudge(base_url, model, ...)`: the BrowseComp grader prompt over any OpenAI-compatible
  `/chat/completions` endpoint (urllib only). The grader answers with
  extracted_final_answer / reasoning / `correct: yes|no` / confidence; the verdict is group
  1 of `correct\\s*:\\s*(yes|no)` (design.md "Scoring": a known bug reads group 0, the
  whole match, and then tests for "yes" in the wrong string).

`filter_stream` applies a judge to a stream. A trajectory without a final `<answer>` or
without a gold answer is dropped with that reason (no judge call). An endpoint failure
raises `JudgeError` naming the trajectory, or, with `on_error="keep"`, keeps the
trajectory and lists it with the error in the report. Verdicts are stored in
`metadata["judge"]`.

Where we deviate from DR-Venus and why
* The grader's verdict line is looked for at the start of a line first (`correct: no` as
  the field the template asks for), and only then anywhere: a reasoning paragraph that
  says "... is not correct: yes, ..." or the word "incorrect: yes" must not decide the
  verdict. `<think>` blocks of reasoning graders are removed before parsing.
* Several gold answers are given to the grader together ("A; or equivalently: B") in one
  call instead of only the first gold (the public code's under-scoring, design.md "Pitfalls").
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from trainers.data.convert import extract_answer
from trainers.trajectory import Trajectory
from venus_gym.scoring import score_answer
from venus_gym.tools.base import ToolBackendError
from venus_gym.tools.http import chat_completion

# The BrowseComp grader template (OpenAI simple-evals), kept word for word so verdicts are
# comparable with published BrowseComp numbers.
BROWSECOMP_GRADER_TEMPLATE = """\
Judge whether the following [response] to [question] is correct or not based on the precise \
and unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the \
extracted answer as 'None' if there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on \
[correct_answer], focusing only on if there are meaningful differences between \
[correct_answer] and the extracted_final_answer. Do not comment on any background to the \
problem, do not attempt to solve the problem, do not argue for any answer different than \
[correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or \
is within a small margin of error for numerical problems. Answer 'no' otherwise, i.e. if \
there if there is any inconsistency, ambiguity, non-equivalency, or if the extracted answer \
is incorrect.

confidence: The extracted confidence score between 0% and 100% from [response]. Put 100 if \
there is no confidence score available.
"""

_VERDICT_LINE = re.compile(r"^[\s*#>-]*correct\s*\**\s*:\s*\**\s*(yes|no)\b",
                           re.IGNORECASE | re.MULTILINE)
_VERDICT_ANYWHERE = re.compile(r"correct\s*:\s*(yes|no)", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_EXTRACTED_LINE = re.compile(r"^[\s*]*extracted_final_answer\s*\**\s*:\s*(.*)$",
                             re.IGNORECASE | re.MULTILINE)
_CONFIDENCE_LINE = re.compile(r"^[\s*]*confidence\s*\**\s*:\s*(\d+(?:\.\d+)?)",
                              re.IGNORECASE | re.MULTILINE)


class JudgeError(RuntimeError):
    """The judge could not give a verdict (endpoint unreachable, HTTP error, unparseable reply)."""


@dataclass(frozen=True)
class Verdict:
    """A judge's decision on one answer.

    correct: whether the trajectory is kept.
    score:   the metric value (EM/F1) or 1.0/0.0 for an LLM verdict.
    detail:  what the judge said (the grader's extracted answer, the metric), for the report.
    """

    correct: bool
    score: float
    detail: str = ""


class Judge(Protocol):
    """Anything that can decide whether a prediction answers a question correctly."""

    name: str

    def judge(self, question: str, prediction: str, answers: Sequence[str]) -> Verdict:
        """Raise JudgeError when no verdict can be reached."""
        ...


class MetricJudge:
    """Correct when `venus_gym.scoring` metric >= threshold (EM is 0/1, so 0.5 = exact)."""

    def __init__(self, metric: str = "em", threshold: float = 0.5):
        if metric not in ("em", "f1"):
            raise ValueError(f"unknown metric {metric!r}; valid: 'em', 'f1'")
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.metric = metric
        self.threshold = threshold
        self.name = f"{metric}>={threshold:g}"

    def judge(self, question: str, prediction: str, answers: Sequence[str]) -> Verdict:
        score = score_answer(prediction, list(answers), self.metric)
        return Verdict(score >= self.threshold, score, f"{self.metric}={score:.3f}")


def parse_grader_reply(text: str) -> tuple[bool, str, float | None]:
    """(correct, extracted_final_answer, confidence) from a BrowseComp grader reply.

    Raises JudgeError when the reply has no `correct: yes|no` field.
    """
    visible = _THINK_BLOCK.sub("", text)
    found = _VERDICT_LINE.search(visible) or _VERDICT_ANYWHERE.search(visible)
    if found is None:
        raise JudgeError(f"grader reply has no 'correct: yes|no' line: {visible[:200]!r}")
    correct = found.group(1).lower() == "yes"  # group 1, never group 0 (module docstring)
    extracted = _EXTRACTED_LINE.search(visible)
    confidence = _CONFIDENCE_LINE.search(visible)
    return (correct, extracted.group(1).strip() if extracted else "",
            float(confidence.group(1)) if confidence else None)


class LLMJudge:
    """The BrowseComp grader over an OpenAI-compatible endpoint (module docstring).

    Args:
        base_url: e.g. "http://127.0.0.1:8000/v1"; "/chat/completions" is appended.
        model: the model name the endpoint serves.
        api_key_env: name of the environment variable holding the API key (the key itself
            never enters a config or report); unset means no Authorization header.
        timeout_s: deadline of one request, the whole reply included.
        retries: extra attempts after a failed request (exponential backoff from
            `backoff_s`, capped at 30 s).
        max_tokens: completion budget of the grader reply.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 60.0, retries: int = 2, backoff_s: float = 1.0,
                 max_tokens: int = 1024):
        if not base_url:
            raise ValueError("LLMJudge needs a base_url, e.g. http://127.0.0.1:8000/v1")
        if not model:
            raise ValueError("LLMJudge needs the endpoint's model name")
        self.base_url = base_url
        self.model = model
        self.api_key = os.environ.get(api_key_env, "") if api_key_env else ""
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_tokens = max_tokens
        self.name = f"llm:{model}"

    def _request(self, prompt: str) -> str:
        try:
            return chat_completion(
                self.base_url, self.model, [{"role": "user", "content": prompt}],
                timeout_s=self.timeout_s, what="judge endpoint", api_key=self.api_key or None,
                extra_body={"temperature": 0.0, "max_tokens": self.max_tokens})
        except ToolBackendError as e:
            raise JudgeError(str(e)) from e

    def judge(self, question: str, prediction: str, answers: Sequence[str]) -> Verdict:
        correct_answer = "; or equivalently: ".join(answers)
        prompt = BROWSECOMP_GRADER_TEMPLATE.format(question=question, response=prediction,
                                                   correct_answer=correct_answer)
        last_error: JudgeError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(30.0, self.backoff_s * 2 ** (attempt - 1)))
            try:
                correct, extracted, confidence = parse_grader_reply(self._request(prompt))
            except JudgeError as e:
                last_error = e
                continue
            detail = f"extracted={extracted!r} confidence={confidence}"
            return Verdict(correct, float(correct), detail)
        assert last_error is not None
        raise JudgeError(f"{last_error} (after {self.retries + 1} attempts)")


@dataclass
class FilterTally:
    """What the filter did: kept / dropped counts by reason, and trajectories kept unjudged."""

    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    kept_on_error: list[str] = field(default_factory=list)


def _verdict_for(judge: Judge, trajectory: Trajectory) -> tuple[str, Verdict | None]:
    """("ok", verdict), or (drop reason, None) when there is nothing to judge."""
    prediction = extract_answer(trajectory)
    if not prediction:
        return "no final answer", None
    if not [a for a in trajectory.answers if a.strip()]:
        return "no gold answer", None
    return "ok", judge.judge(trajectory.question, prediction, trajectory.answers)


def filter_stream(trajectories: Iterable[Trajectory], judge: Judge, tally: FilterTally,
                  on_error: str = "fail", workers: int = 1, chunk: int = 64
                  ) -> Iterator[Trajectory]:
    """Yield the trajectories `judge` finds correct, in input order (module docstring).

    workers > 1 judges a chunk of trajectories concurrently (for LLM endpoints).
    """
    if on_error not in ("fail", "keep"):
        raise ValueError(f"on_error must be 'fail' or 'keep', got {on_error!r}")

    def attempt(trajectory: Trajectory) -> tuple[str, Verdict | None, str]:
        try:
            reason, verdict = _verdict_for(judge, trajectory)
        except JudgeError as e:
            return "error", None, str(e)
        return reason, verdict, ""

    def batches() -> Iterator[list[Trajectory]]:
        batch: list[Trajectory] = []
        for trajectory in trajectories:
            batch.append(trajectory)
            if len(batch) >= chunk:
                yield batch
                batch = []
        if batch:
            yield batch

    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        for batch in batches():
            results = list(pool.map(attempt, batch)) if pool else [attempt(t) for t in batch]
            for trajectory, (reason, verdict, error) in zip(batch, results):
                if reason == "error":
                    if on_error == "fail":
                        raise JudgeError(f"trajectory {trajectory.id!r}: {error}")
                    tally.kept_on_error.append(f"{trajectory.id}: {error}")
                    tally.kept += 1
                    yield _with_judgement(trajectory, judge.name, None, error)
                elif verdict is None:
                    tally.dropped[reason] += 1
                elif verdict.correct:
                    tally.kept += 1
                    yield _with_judgement(trajectory, judge.name, verdict, "")
                else:
                    tally.dropped["judged incorrect"] += 1
    finally:
        if pool:
            pool.shutdown(wait=False, cancel_futures=True)


def _with_judgement(trajectory: Trajectory, judge_name: str, verdict: Verdict | None,
                    error: str) -> Trajectory:
    record: dict[str, Any] = {"judge": judge_name}
    if verdict is not None:
        record.update(correct=verdict.correct, score=verdict.score, detail=verdict.detail)
    else:
        record.update(correct=None, error=error)
    return replace(trajectory, metadata={**trajectory.metadata, "judge": record})
