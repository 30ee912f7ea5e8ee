"""A VLLMEngine in a process of its own, for tests/vllm/test_vllm_multiprocess.py.

    python tests/vllm/vllm_engine_process.py JOB.json RESULT.json

vLLM reads VLLM_ENABLE_V1_MULTIPROCESSING once per process (and the other tests/vllm
tests run an in-process engine), so a multi-process engine is tested from a fresh process
started with the variable set. JOB.json names the model directory, the new weights
(torch.save of a state dict), the prompts as token ids and extra VLLMEngine arguments;
RESULT.json gets the greedy ids and log-probs before and after `update_weights`, the path
the engine chose and the process ids of its workers. vLLM may start its processes with
spawn, which re-imports this file: hence the __main__ guard.
"""

from __future__ import annotations

import json
import os
import sys


def main(job_path: str, result_path: str) -> None:
    import torch

    from trainers.engines.base import GenerationRequest
    from trainers.engines.vllm_engine import VLLMEngine

    job = json.loads(open(job_path).read())
    engine = VLLMEngine(job["model_dir"], max_model_len=512, **job.get("engine", {}))
    try:
        requests = [GenerationRequest(ids, max_new_tokens=24, temperature=0,
                                      stop_token_ids=[job["eot"]]) for ids in job["prompts"]]

        def greedy() -> list[dict[str, object]]:
            return [{"token_ids": r.token_ids, "logprobs": r.logprobs,
                     "finish_reason": r.finish_reason} for r in engine.generate(requests)]

        before = greedy()
        engine.update_weights(torch.load(job["new_weights"], weights_only=True))
        after = greedy()
        result = {"pid": os.getpid(), "weights_in_process": engine.weights_in_process,
                  "worker_pids": engine.llm.collective_rpc("weight_receiver_pid"),
                  "before": before, "after": after}
    finally:
        engine.close()
    with open(result_path, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
