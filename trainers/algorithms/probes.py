"""Information-gain probes built on token ids (design.md "RL").

A probe is the fixed pseudo-response that asks the policy "how likely is the gold answer
now?". Appended at a turn boundary b (the end of history h_<=t) it reads, as token ids:

    generation_prompt_ids   the chat template's assistant header, e.g. ChatML
                            "<|im_start|>assistant\\n<think>\\n" (the caller passes it:
                            it is template-specific and the trajectory's own turns start
                            with exactly these ids)
    prefix_ids              "Now there's enough information to answer\\n</think>\\n<answer>\\n"
    answer_ids              a*  (the gold answer, stripped of surrounding whitespace)
    suffix_ids              "\\n</answer>" followed by the EOS id (an id, never text)

and only the answer span is scored: s = mean_j log pi(a*_j | h, probe, a*_<j), teacher
forced, logits divided by the rollout temperature, no gradient.

Why token ids and separately tokenised pieces. The reference code tokenised the probe
text against decoded context, so the probe tokens and the answer span drifted with the
BPE merges at the join (design.md "Pitfalls"). Here the probe is appended as ids to the
trajectory's exact ids, and the three text pieces are tokenised separately, so the answer
span `[answer_start, answer_end)` is known exactly by construction.
The consequence: at the two joins (prefix|answer, answer|suffix) the ids may differ from
tokenising the whole probe text in one go when a BPE merge would cross a join (e.g. an
answer ending in "." followed by "\\n" can merge into ".\\n" with Qwen's pre-tokeniser).
This is acceptable for information gain: the probe is one fixed token sequence per gold
answer, scored at every boundary of a trajectory, and IG is the difference of two scores
of that same sequence, so a non-canonical split moves both terms alike. The answer tokens
themselves are the answer's own canonical tokenisation. `tokenisation_drift` reports
whether a given answer drifts, for tests and for users who want to check their tokenizer.

Several gold answers: one probe per answer; the score of a boundary is the best (maximum)
over answers (trainers.algorithms.information_gain.best_answer_scores), so IG measures progress
towards whichever accepted answer the history supports best. Deviation from the public
code, which used only the first answer: a trajectory that gathers evidence for an
accepted alias ("NYC" for "New York City") should be credited for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

PROBE_PREFIX_TEXT = "Now there's enough information to answer\n</think>\n<answer>\n"
PROBE_SUFFIX_TEXT = "\n</answer>"
CHATML_THINKING_GENERATION_PROMPT = "<|im_start|>assistant\n<think>\n"


class TextTokenizer(Protocol):
    """What probes need from a tokenizer (a Hugging Face tokenizer satisfies it)."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class Probe:
    """Token ids of one probe and the exact span of the gold answer inside it.

    ids:          generation prompt + prefix + answer + suffix (EOS included).
    answer_start: index in `ids` of the first answer token (>= 1, so the token predicting
                  it belongs to the probe itself).
    answer_end:   index one past the last answer token.
    answer:       the gold answer text, for reports.
    """

    ids: tuple[int, ...]
    answer_start: int
    answer_end: int
    answer: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.answer_start < self.answer_end <= len(self.ids):
            raise ValueError(
                f"probe answer span [{self.answer_start}, {self.answer_end}) must be non-empty, "
                f"start at index >= 1 and lie inside the {len(self.ids)} probe ids")

    @property
    def answer_ids(self) -> tuple[int, ...]:
        return self.ids[self.answer_start:self.answer_end]


@dataclass(frozen=True)
class ProbeTemplate:
    """The fixed token ids around the answer, shared by every probe of one tokenizer."""

    generation_prompt_ids: tuple[int, ...]
    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]  # ends with the EOS id
    prefix_text: str = PROBE_PREFIX_TEXT
    suffix_text: str = PROBE_SUFFIX_TEXT

    def probe_for_ids(self, answer_ids: Sequence[int], answer: str = "") -> Probe:
        """A probe around an already tokenised answer."""
        head = self.generation_prompt_ids + self.prefix_ids
        ids = head + tuple(int(i) for i in answer_ids) + self.suffix_ids
        return Probe(ids=ids, answer_start=len(head), answer_end=len(head) + len(answer_ids),
                     answer=answer)


def encode_text(tokenizer: TextTokenizer, text: str) -> list[int]:
    """Token ids of `text` without BOS/EOS or other special tokens added by the tokenizer."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def build_probe_template(
    tokenizer: TextTokenizer,
    generation_prompt_ids: Sequence[int],
    eos_token_id: int | None = None,
    prefix_text: str = PROBE_PREFIX_TEXT,
    suffix_text: str = PROBE_SUFFIX_TEXT,
) -> ProbeTemplate:
    """Tokenise the fixed probe pieces once.

    generation_prompt_ids: ids that open an assistant turn in the chat template (ChatML with
        thinking: the ids of CHATML_THINKING_GENERATION_PROMPT). They must equal the ids
        that precede every generated turn in the trajectories, so the probe continues the
        conversation exactly as a real turn would.
    eos_token_id: id ending an assistant turn (ChatML: <|im_end|>); default tokenizer's EOS.
    """
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id; pass eos_token_id explicitly")
    prefix = encode_text(tokenizer, prefix_text)
    return ProbeTemplate(
        generation_prompt_ids=tuple(int(i) for i in generation_prompt_ids),
        prefix_ids=tuple(prefix),
        suffix_ids=tuple(encode_text(tokenizer, suffix_text)) + (int(eos),),
        prefix_text=prefix_text,
        suffix_text=suffix_text,
    )


def build_probes(
    tokenizer: TextTokenizer, template: ProbeTemplate, answers: Sequence[str]
) -> list[Probe]:
    """One probe per gold answer (answers are stripped; empty answers are rejected)."""
    probes = []
    for answer in answers:
        text = answer.strip()
        if not text:
            raise ValueError(f"gold answer {answer!r} is empty after stripping whitespace")
        probes.append(template.probe_for_ids(encode_text(tokenizer, text), answer=text))
    if not probes:
        raise ValueError("build_probes needs at least one gold answer")
    return probes


def tokenisation_drift(tokenizer: TextTokenizer, template: ProbeTemplate, probe: Probe) -> bool:
    """True if tokenising the whole probe text at once would give different ids.

    Only the text pieces are compared (prefix + answer + suffix text, EOS excluded): the
    generation prompt is given as ids and never re-tokenised.
    """
    pieces = template.prefix_ids + probe.answer_ids + template.suffix_ids[:-1]
    whole = encode_text(tokenizer, template.prefix_text + probe.answer + template.suffix_text)
    return tuple(whole) != pieces
