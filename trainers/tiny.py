"""Tiny random decoders and a locally trained tokenizer, for tests and benchmarks.

Nothing is downloaded: models are built from small transformers configs with seeded random
weights, and the tokenizer is a byte-level BPE trained in a fraction of a second on a few
built-in sentences, with ChatML-style special tokens so probes and chat headers look like
the real thing.
"""

from __future__ import annotations

import torch

ARCHITECTURES = ("qwen3", "qwen2", "llama")
CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                       "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

_TRAINING_TEXT = [
    "Now there's enough information to answer",
    "The capital of France is Paris. Paris lies on the Seine.",
    "Search results: 1. [Title](https://example.org/page) a short snippet",
    "<answer>\nNew York City\n</answer> <answer>\nParis\n</answer>",
    "The useful information in the page for the user goal is as follows: evidence, summary.",
    "Who wrote the novel? Which river flows through the city? When was it founded?",
    '{"name": "search", "arguments": {"query": ["capital of France"]}}',
]


def tiny_causal_lm(arch: str = "qwen3", vocab_size: int = 512, hidden_size: int = 64,
                   num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                   intermediate_size: int | None = None, max_positions: int = 8192,
                   seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A randomly initialised decoder in eval mode (SDPA attention, untied head).

    arch: "qwen3", "qwen2" or "llama". The head dimension is hidden_size // num_heads.
    """
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    classes = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
               "llama": (LlamaConfig, LlamaForCausalLM)}
    if arch not in classes:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    config_class, model_class = classes[arch]
    config = config_class(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_positions, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = model_class(config).to(dtype)
    # Random init is small (std 0.02): widen the head so log-probs vary across contexts and
    # tests that compare them are not trivially passed by a near-uniform model.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(25.0)
    return model.eval()


def tiny_tokenizer(vocab_size: int = 400):
    """A byte-level BPE tokenizer (transformers fast tokenizer) with ChatML special tokens.

    eos_token is <|im_end|>, as in Qwen chat models.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(CHAT_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_TRAINING_TEXT, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
