"""Answer scoring: exact match and token F1 against one or more gold answers.

The conventions are those of the QA benchmarks the recipe reports on
(docs/design.md, "Scoring"), so numbers here are comparable with published ones:

* SQuAD normalisation: lowercase, delete ASCII punctuation (`string.punctuation`), drop
  the articles a/an/the as whole words, collapse runs of whitespace. Non-ASCII
  punctuation is kept, as in the official SQuAD script.
* Exact match (EM): 1.0 when the normalised prediction equals a normalised gold, else 0.0.
* F1: multiset token overlap between normalised prediction and gold,
  F1 = 2PR / (P + R). HotpotQA's rule applies on top: when the normalised prediction or
  gold is one of "yes", "no", "noanswer" and the two differ, F1 is 0 for that gold (so
  "yes" earns nothing against "yes sir").
* Several golds: the score is the maximum over all of them (DR-Venus's public code used
  only the first gold, which under-scores aliases).

Edge cases, decided once here:
* A prediction that is None, empty or whitespace only scores 0.0 under every metric (an
  agent that gives no answer is never right). The same holds for each blank gold string.
* A non-blank text may still normalise to nothing ("The", "?!"). EM then compares the
  empty strings like SQuAD does; F1 is 1.0 when both sides are empty and 0.0 when one is.
* `golds` may be one string or a sequence of strings; an empty sequence raises ValueError
  and a non-string element raises TypeError, since both mean the task data is broken.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

_PUNCTUATION_TABLE = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_YES_NO_ANSWERS = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, no punctuation, no articles, single spaces.

    Args:
        text: an answer string.

    Returns:
        The normalised string, e.g. "The  Eiffel-Tower!" -> "eiffeltower".
    """
    lowered = text.lower()
    without_punctuation = lowered.translate(_PUNCTUATION_TABLE)
    without_articles = _ARTICLES.sub(" ", without_punctuation)
    return " ".join(without_articles.split())


def _gold_list(golds: str | Sequence[str]) -> list[str]:
    """Accept one gold or several; reject an empty list and non-string golds."""
    gold_list = [golds] if isinstance(golds, str) else list(golds)
    if not gold_list:
        raise ValueError("golds is empty: at least one gold answer is needed to score")
    for gold in gold_list:
        if not isinstance(gold, str):
            raise TypeError(f"gold answers must be strings, got {type(gold).__name__}")
    return gold_list


def _is_blank(text: str | None) -> bool:
    if text is None:
        return True
    if not isinstance(text, str):
        raise TypeError(f"prediction must be a string or None, got {type(text).__name__}")
    return not text.strip()


def _exact_match_one(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1_one(prediction: str, gold: str) -> float:
    normalized_prediction = normalize_answer(prediction)
    normalized_gold = normalize_answer(gold)
    is_yes_no = normalized_prediction in _YES_NO_ANSWERS or normalized_gold in _YES_NO_ANSWERS
    if is_yes_no and normalized_prediction != normalized_gold:
        return 0.0
    prediction_tokens = normalized_prediction.split()
    gold_tokens = normalized_gold.split()
    if not prediction_tokens or not gold_tokens:
        # Both empty means the texts agree (EM says 1 too); one empty means no overlap.
        return float(prediction_tokens == gold_tokens)
    overlap = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _best_over_golds(
    pair_score: Callable[[str, str], float],
    prediction: str | None,
    golds: str | Sequence[str],
) -> float:
    """Max of pair_score over the non-blank golds; 0.0 for a blank prediction."""
    gold_list = _gold_list(golds)
    if _is_blank(prediction):
        return 0.0
    return max(
        (pair_score(prediction, gold) for gold in gold_list if not _is_blank(gold)),
        default=0.0,
    )


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold, else 0.0.

    Args:
        prediction: the agent's answer (None or blank scores 0.0).
        golds: one gold answer or a non-empty sequence of accepted answers.

    Raises:
        ValueError: `golds` is an empty sequence.
        TypeError: a gold or the prediction is not a string.
    """
    return _best_over_golds(_exact_match_one, prediction, golds)


def f1_score(prediction: str | None, golds: str | Sequence[str]) -> float:
    """Best multiset token F1 of the prediction against any gold (HotpotQA yes/no rule).

    Example: "the cat sat" vs "cat sat on mat" normalise to [cat, sat] and
    [cat, sat, on, mat]: P = 2/2, R = 2/4, F1 = 2/3.

    Args:
        prediction: the agent's answer (None or blank scores 0.0).
        golds: one gold answer or a non-empty sequence of accepted answers.

    Raises:
        ValueError: `golds` is an empty sequence.
        TypeError: a gold or the prediction is not a string.
    """
    return _best_over_golds(_f1_one, prediction, golds)


_METRICS: dict[str, Callable[[str | None, str | Sequence[str]], float]] = {
    "em": exact_match,
    "f1": f1_score,
}


def score_answer(prediction: str | None, golds: str | Sequence[str], metric: str = "em") -> float:
    """Score an answer with the named metric.

    Args:
        prediction: the agent's answer (None or blank scores 0.0).
        golds: one gold answer or a non-empty sequence of accepted answers.
        metric: "em" (exact match) or "f1" (token F1).

    Raises:
        ValueError: an unknown metric, or an empty `golds` sequence.
        TypeError: a gold or the prediction is not a string.
    """
    if metric not in _METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid metrics: {', '.join(_METRICS)}")
    return _METRICS[metric](prediction, golds)
