"""Build the pieces of an SFT run from its config: tokenizer, model, oracle data, samples.

Kept apart from the training loop so examples, benchmarks, tests and data-parallel workers
build identical models and data from the same config (every step here is seeded).

Where we deviate from DR-Venus and why
* `tokenizer: world` trains a byte-level BPE tokenizer on the embedded world's pages,
  questions and the environment's system prompt, so that a tiny model trained from scratch
  on a CPU sees entity names as a few tokens (DR-Venus uses Qwen3's 151K-token vocabulary).
* The chat template is the model's own when it renders prefix-stably (`model.chat_template:
  model`); Qwen3's, which strips `<think>` from earlier turns, is refused with the fix named
  (`chatml`) rather than rendered turn by turn: rollouts then see the same ids as SFT.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from trainers.data.oracle_data import (
    DEFAULT_MIXTURE,
    PLAIN_MIXTURE,
    SHORT_MIXTURE,
    OracleDataConfig,
    generate_oracle_trajectories,
    tokenize_trajectories,
    world_texts,
)
from trainers.modeling.grow import grow_layers
from trainers.modeling.lora import LoraSettings, apply_lora, has_lora, merged_state_dict
from trainers.modeling.models import (
    build_chat_tokenizer,
    build_chatml_tokenizer,
    build_tiny_causal_lm,
    load_causal_lm,
    load_pretrained_tokenizer,
    load_smollm2,
    resolve_dtype,
    resolve_model_path,
)
from trainers.modeling.tokenization import ChatTokenizer
from trainers.modeling.warm_start import write_policy_record
from trainers.sft.config import ModelConfig, SFTExperimentConfig
from trainers.sft.packing import SFTSample, samples_from_trajectories
from trainers.trajectory import Trajectory, read_trajectories

MIXTURES = {"default": DEFAULT_MIXTURE, "short": SHORT_MIXTURE, "plain": PLAIN_MIXTURE}


@functools.lru_cache(maxsize=4)
def _world_tokenizer(vocab_size: int, world_size: int | None, world_seeds: tuple[int, ...],
                     pretokenizer: str = "bytelevel", world: str = "synthetic") -> Any:
    if world != "synthetic":  # a real world (hotpotqa, a QA JSONL, a saved world): its text
        texts = world_texts({"world": world})
    else:
        size = {} if world_size is None else {"world_size": world_size}  # None: env default
        texts = [text for seed in world_seeds
                 for text in world_texts({**size, "world_seed": seed})]
    return build_chatml_tokenizer(texts, vocab_size=vocab_size, pretokenizer=pretokenizer)


def build_tokenizer(model_config: ModelConfig, env_kwargs: dict[str, Any],
                    world_seeds: tuple[int, ...] = ()) -> Any:
    """The run's tokenizer (see ModelConfig.tokenizer). A world tokenizer is trained on the
    worlds `world_seeds` (the training data's; empty = env_kwargs' world) and cached per
    (vocab size, worlds) within the process."""
    if model_config.tokenizer == "world":
        world = env_kwargs.get("world", "synthetic")
        if not isinstance(world, str):
            raise ValueError("model.tokenizer 'world' needs env.world as a name or path")
        seeds = tuple(world_seeds) or (env_kwargs.get("world_seed", 0),)
        return _world_tokenizer(model_config.vocab_size, env_kwargs.get("world_size"), seeds,
                                model_config.pretokenizer, world)
    if model_config.tokenizer == "model":
        if model_config.name == "smollm2":
            return load_smollm2(tokenizer_only=True)[0]
        return load_pretrained_tokenizer(model_config.name, what="model.name")
    return AutoTokenizer.from_pretrained(resolve_model_path(model_config.tokenizer),
                                         local_files_only=True)


def build_chat(tokenizer: Any, chat_template: str = "model") -> ChatTokenizer:
    """The run's ChatTokenizer (ModelConfig.chat_template: the tokenizer's own template,
    checked for prefix stability, 'chatml' or a Jinja file); `tokenizer` is set to render
    with it, so the saved tokenizer carries it (trainers.modeling.models.build_chat_tokenizer)."""
    return build_chat_tokenizer(tokenizer, chat_template)


def build_model(model_config: ModelConfig, tokenizer: Any) -> PreTrainedModel:
    """The model to train, in train mode."""
    if model_config.name == "tiny":
        model = build_tiny_causal_lm(
            tokenizer, arch=model_config.arch, hidden=model_config.hidden,
            layers=model_config.layers, heads=model_config.heads,
            intermediate=model_config.intermediate or 4 * model_config.hidden,
            max_positions=model_config.max_positions, seed=model_config.init_seed,
            dtype=resolve_dtype(model_config.dtype))
    elif model_config.name == "smollm2":
        model = load_smollm2(dtype=resolve_dtype(model_config.dtype))[1]
    else:  # a saved model directory, a .gguf file, a cached hub id or warm-start
        try:
            model = load_causal_lm(model_config.name, dtype=resolve_dtype(model_config.dtype),
                                   what="model.name")
        except FileNotFoundError as error:
            raise ValueError(f"model.name must be 'tiny', 'smollm2' or a model that loads "
                             f"offline: {error}") from None
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    if model_config.grow_layers_after:
        model = grow_layers(model, model_config.grow_layers_after)
    if model_config.lora_rank:
        model = apply_lora(model, LoraSettings(
            rank=model_config.lora_rank, alpha=model_config.lora_alpha,
            dropout=model_config.lora_dropout, targets=tuple(model_config.lora_targets)))
    return model.train()


def save_model(model: PreTrainedModel, directory: str | Path) -> None:
    """save_pretrained; a model with LoRA adapters is saved merged (base + delta) as a plain
    checkpoint, which RL, evaluation and engines load like any other."""
    if not has_lora(model):
        model.save_pretrained(directory)
        return
    plain = AutoModelForCausalLM.from_config(model.config, dtype=model.dtype)
    plain.load_state_dict(merged_state_dict(model))
    plain.generation_config = model.generation_config
    plain.save_pretrained(directory)


def build_trajectories(config: SFTExperimentConfig, chat: ChatTokenizer) -> list[Trajectory]:
    """Tokenised training trajectories: from data.jsonl if set, else fresh oracle episodes."""
    if config.data.jsonl:
        trajectories = read_trajectories(config.data.jsonl)
    else:
        trajectories = generate_oracle_trajectories(oracle_data_config(config),
                                                    workers=config.data.workers,
                                                    progress=config.train.progress_bar)
    return tokenize_trajectories(trajectories, chat, workers=config.data.workers,
                                 progress=config.train.progress_bar)


def oracle_data_config(config: SFTExperimentConfig) -> OracleDataConfig:
    """The oracle data an SFT config asks for (episodes, seed, worlds, mixture)."""
    if config.data.mixture not in MIXTURES:
        raise ValueError(f"data.mixture must be one of {sorted(MIXTURES)}, got "
                         f"{config.data.mixture!r}")
    return OracleDataConfig(num_episodes=config.data.num_episodes, seed=config.data.seed,
                            env_kwargs=config.env_kwargs(), mixture=MIXTURES[config.data.mixture],
                            world_seeds=tuple(config.data.world_seeds),
                            recovery_prob=config.data.recovery_prob,
                            recovery_kinds=tuple(config.data.recovery_kinds),
                            plan_steps=config.data.plan_steps)


def build_samples(config: SFTExperimentConfig, chat: ChatTokenizer) -> list[SFTSample]:
    """Training samples; says how many trajectories lost their policy tokens to truncation
    and refuses to continue when none is left."""
    trajectories = build_trajectories(config, chat)
    samples = samples_from_trajectories(trajectories, config.data.max_seq_len)
    dropped = len(trajectories) - len(samples)
    if not samples:
        raise ValueError(f"no training samples: all {len(trajectories)} trajectories have no "
                         f"policy token within data.max_seq_len={config.data.max_seq_len} "
                         f"tokens; raise data.max_seq_len")
    if dropped:
        warnings.warn(f"{dropped} of {len(trajectories)} trajectories have no policy token "
                      f"within data.max_seq_len={config.data.max_seq_len} and are not trained "
                      f"on", RuntimeWarning, stacklevel=2)
    return samples


def prepare_model(config: SFTExperimentConfig, tokenizer: Any) -> PreTrainedModel:
    """The model `train_sft` starts from: built, placed on train.device (single-process runs;
    data-parallel workers place their own replicas) and, unless resuming, put through the
    induction warm-up. Call it before building the data: a warm-up that misses its target
    (InductionWarmupError) then costs no data time."""
    from trainers.modeling.models import resolve_device

    model = build_model(config.model, tokenizer)
    if config.train.num_workers == 1:
        model = model.to(resolve_device(config.train.device, "train.device"))
    if config.train.induction_warmup_steps and not config.train.resume:
        from trainers.sft.warmup import induction_warmup

        special = max(tokenizer.all_special_ids or [0])
        induction_warmup(model, len(tokenizer), steps=config.train.induction_warmup_steps,
                         batch_size=config.train.induction_warmup_batch_size,
                         lr=config.train.induction_warmup_lr,
                         target_loss=config.train.induction_warmup_target_loss,
                         low_id=min(special + 1, len(tokenizer) - 1), seed=config.train.seed)
    return model


def train_sft(config: SFTExperimentConfig, samples: list[SFTSample] | None = None,
              model: PreTrainedModel | None = None
              ) -> tuple[PreTrainedModel, Any, list[dict[str, Any]]]:
    """Build the tokenizer, model (`prepare_model`, unless given) and data (unless given) of
    `config`, train (in this process or data parallel on Ray when train.num_workers > 1,
    resuming if train.resume says so) and save the model and tokenizer to
    `train.output_dir/final`. Returns (model, tokenizer, history).
    """
    from trainers.sft.config import config_to_dict
    from trainers.sft.trainer import SFTTrainer, latest_checkpoint

    output_dir = Path(config.train.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(config.model, config.env_kwargs(), config.data.world_seeds)
    # Built even when samples are given: it sets the tokenizer's template, which the saved
    # tokenizer must carry (the RL trainer renders with the policy directory's template).
    chat = build_chat(tokenizer, config.model.chat_template)
    if model is None:
        model = prepare_model(config, tokenizer)
    if samples is None:
        samples = build_samples(config, chat)
    if config.train.num_workers > 1:
        from trainers.sft.distributed import train_data_parallel

        state = train_data_parallel(config, model, samples, tokenizer.pad_token_id)
        model.load_state_dict(state["model"])
        history = state["history"]
    else:
        trainer = SFTTrainer(model, samples, config.train, config.data, tokenizer.pad_token_id,
                             config_record=config_to_dict(config))
        resume = config.train.resume
        if resume:
            trainer.load_checkpoint(latest_checkpoint(output_dir) if resume == "latest"
                                    else resume)
        history = trainer.train()
        trainer.save_checkpoint()
    save_model(model, output_dir / "final")
    tokenizer.save_pretrained(output_dir / "final")
    write_sft_record(config, output_dir / "final")
    return model, tokenizer, history


def write_sft_record(config: SFTExperimentConfig, final: Path) -> None:
    """The final policy's warm_start.json: the env settings its data was made with and the
    generated worlds it saw (with those of the policy it continued), so `eval`, `chat` and
    `rl` play it as it was trained (trainers.modeling.warm_start.policy_env)."""
    generated = config.env.world == "synthetic" and not config.data.jsonl
    seeds = list(config.data.world_seeds or [config.env.world_seed]) if generated else []
    env = {"prompt_style": config.env.prompt_style, "search_top_k": config.env.search_top_k,
           **({"hops": tuple(config.env.hops)} if generated else {})}
    write_policy_record(final, env, stage="sft", start=config.model.name or None,
                        sft_world_seeds=seeds,
                        world_size=config.env.world_size if generated else None)
