"""Probe construction on token ids: exact answer spans, several answers, drift detection."""

import pytest

from trainers.algorithms.probes import (
    CHATML_THINKING_GENERATION_PROMPT,
    PROBE_PREFIX_TEXT,
    PROBE_SUFFIX_TEXT,
    Probe,
    ProbeTemplate,
    build_probe_template,
    build_probes,
    encode_text,
    tokenisation_drift,
)
from trainers.modeling.models import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_probe_layout_and_exact_answer_span(tokenizer):
    header = encode_text(tokenizer, CHATML_THINKING_GENERATION_PROMPT)
    template = build_probe_template(tokenizer, header)
    probes = build_probes(tokenizer, template, ["Paris", "  New York City \n", "U.S."])
    assert [p.answer for p in probes] == ["Paris", "New York City", "U.S."]
    for probe in probes:
        ids = list(probe.ids)
        assert ids[:len(header)] == header  # the assistant header opens the probe
        assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")  # EOS as an id
        assert tokenizer.decode(list(probe.answer_ids)) == probe.answer
        assert list(probe.answer_ids) == encode_text(tokenizer, probe.answer)
        head = tokenizer.decode(ids[:probe.answer_start])
        assert head == CHATML_THINKING_GENERATION_PROMPT + PROBE_PREFIX_TEXT
        tail = tokenizer.decode(ids[probe.answer_end:-1])
        assert tail == PROBE_SUFFIX_TEXT
    # the fixed pieces are shared: only the answer differs between probes
    assert probes[0].ids[:probes[0].answer_start] == probes[1].ids[:probes[1].answer_start]


def test_eos_and_answer_validation(tokenizer):
    template = build_probe_template(tokenizer, [1], eos_token_id=0)
    assert template.suffix_ids[-1] == 0
    with pytest.raises(ValueError, match="empty"):
        build_probes(tokenizer, template, ["   "])
    with pytest.raises(ValueError, match="at least one"):
        build_probes(tokenizer, template, [])
    with pytest.raises(ValueError, match="answer span"):
        Probe(ids=(1, 2, 3), answer_start=0, answer_end=2)  # nothing in the probe predicts it
    with pytest.raises(ValueError, match="answer span"):
        Probe(ids=(1, 2, 3), answer_start=2, answer_end=2)


def test_probe_for_ids():
    template = ProbeTemplate(generation_prompt_ids=(7,), prefix_ids=(8, 9), suffix_ids=(5, 0))
    probe = template.probe_for_ids([40, 41], answer="x")
    assert probe.ids == (7, 8, 9, 40, 41, 5, 0)
    assert (probe.answer_start, probe.answer_end, probe.answer_ids) == (3, 5, (40, 41))


class GreedyTokenizer:
    """Longest-match tokenizer whose vocabulary has merges that cross probe joins."""

    eos_token_id = 0

    def __init__(self, extra_tokens):
        text = PROBE_PREFIX_TEXT + PROBE_SUFFIX_TEXT + "abcdefghijklmnopqrstuvwxyz.ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        self.vocab = {tok: i + 1 for i, tok in enumerate(sorted(set(text)) + list(extra_tokens))}

    def encode(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            match = max((t for t in self.vocab if text.startswith(t, i)), key=len)
            ids.append(self.vocab[match])
            i += len(match)
        return ids


def test_tokenisation_drift_is_detected_and_the_span_stays_exact():
    tokenizer = GreedyTokenizer(extra_tokens=[".\n"])  # merges across the answer|suffix join
    template = build_probe_template(tokenizer, [99])
    drifting, clean = build_probes(tokenizer, template, ["U.S.", "Rome"])
    assert tokenisation_drift(tokenizer, template, drifting)
    assert not tokenisation_drift(tokenizer, template, clean)
    # Pieces are tokenised separately, so the answer span is still exactly the answer.
    assert list(drifting.answer_ids) == tokenizer.encode("U.S.")
