"""Tests for venus_gym.scoring: SQuAD normalisation, EM and token F1."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from venus_gym.scoring import exact_match, f1_score, normalize_answer, score_answer


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The Cat!", "cat"),
        ("  an  apple   a day ", "apple day"),
        ("Theater at the Anchor", "theater at anchor"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("rock-and-roll", "rockandroll"),  # punctuation is deleted, not replaced by a space
        ("The  Eiffel-Tower!", "eiffeltower"),
        ("Café\tMÜNCHEN\n", "café münchen"),
        ("«Paris»", "«paris»"),  # only ASCII punctuation is removed, as in SQuAD
        ("A", ""),
        ("", ""),
    ],
)
def test_normalize_answer(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_exact_match_after_normalisation():
    assert exact_match("The Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert exact_match("Eiffel", ["Tour Eiffel", "eiffel"]) == 1.0
    assert exact_match("Lyon", ("Paris", "Paris, France")) == 0.0


def test_f1_hand_worked_numbers():
    # [cat, sat] vs [cat, sat, on, mat]: P = 2/2, R = 2/4.
    assert f1_score("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)
    # Multiset overlap: cat appears once in the gold, so only one of three counts.
    # P = 1/3, R = 1/2, F1 = 2 * (1/6) / (5/6) = 0.4.
    assert f1_score("cat cat cat", "cat sat") == pytest.approx(0.4)
    assert f1_score("Paris", "paris") == 1.0
    assert f1_score("Lyon", "Paris") == 0.0


def test_f1_takes_the_best_gold():
    assert f1_score("cat sat", ["dog", "cat sat on mat"]) == pytest.approx(2 / 3)
    assert f1_score("cat sat", ["dog", "cat sat on mat", "The cat sat."]) == 1.0


def test_f1_yes_no_rule():
    assert f1_score("yes", "yes sir") == 0.0  # would be 2/3 without the rule
    assert f1_score("yes sir", "yes") == 0.0  # the rule applies to the gold side too
    assert f1_score("no answer", "noanswer") == 0.0
    assert f1_score("no", "no") == 1.0
    assert f1_score("Yes.", "yes") == 1.0
    assert f1_score("yes", ["yes sir", "yes"]) == 1.0


@pytest.mark.parametrize("blank", [None, "", "   \n"])
@pytest.mark.parametrize("metric", ["em", "f1"])
def test_blank_prediction_scores_zero(blank, metric):
    assert score_answer(blank, ["", "Paris"], metric=metric) == 0.0


def test_blank_gold_never_matches():
    assert exact_match("the", [""]) == 0.0
    assert f1_score("the", "   ") == 0.0
    assert exact_match("Paris", ["", "paris"]) == 1.0


def test_texts_that_normalise_to_nothing():
    assert exact_match("The", "a") == 1.0  # SQuAD compares the empty strings
    assert f1_score("The", "a") == 1.0
    assert f1_score("The", "cat") == 0.0
    assert f1_score("cat", "?!") == 0.0


def test_score_answer_dispatches_on_metric():
    assert score_answer("the cat sat", "cat sat on mat") == 0.0
    assert score_answer("the cat sat", "cat sat on mat", metric="em") == 0.0
    assert score_answer("the cat sat", "cat sat on mat", metric="f1") == pytest.approx(2 / 3)


def test_unknown_metric_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown metric 'bleu'; valid metrics: em, f1"):
        score_answer("x", "x", metric="bleu")


@pytest.mark.parametrize("scorer", [exact_match, f1_score])
def test_empty_gold_list_is_an_error(scorer):
    with pytest.raises(ValueError, match="golds is empty"):
        scorer("Paris", [])
    with pytest.raises(ValueError, match="golds is empty"):
        scorer(None, ())


@pytest.mark.parametrize("scorer", [exact_match, f1_score])
def test_wrong_types_are_errors(scorer):
    with pytest.raises(TypeError, match="gold answers must be strings"):
        scorer("Paris", ["Paris", 3])
    with pytest.raises(TypeError, match="prediction must be a string or None"):
        scorer(3, "Paris")


answers = st.text(max_size=30)
gold_lists = st.lists(answers, min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(prediction=answers, golds=gold_lists)
def test_scores_are_bounded_and_f1_never_below_em(prediction, golds):
    em = exact_match(prediction, golds)
    f1 = f1_score(prediction, golds)
    assert em in (0.0, 1.0)
    assert 0.0 <= f1 <= 1.0
    assert f1 >= em


@settings(max_examples=200, deadline=None)
@given(text=answers.filter(str.strip), other=answers.filter(str.strip))
def test_self_match_and_f1_symmetry(text, other):
    assert exact_match(text, text) == 1.0
    assert f1_score(text, text) == 1.0
    assert f1_score(text, other) == pytest.approx(f1_score(other, text))
    assert normalize_answer(normalize_answer(text)) == normalize_answer(text)
