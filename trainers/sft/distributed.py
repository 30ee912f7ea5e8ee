"""Data-parallel SFT on Ray: one actor per worker, torch.distributed (gloo on CPU, NCCL on GPU).

`train_data_parallel(config, model, samples, pad_id)` starts `config.train.num_workers`
Ray actors. Each joins one torch.distributed process group, receives the same model and
samples, and runs `SFTTrainer`, which gives worker r every world_size-th row of each global
batch and all-reduces gradients, so the replicas stay identical and the run computes what a
single worker computes on the same global batch (tests/test_sft_distributed.py checks both).

Ray is only at the edge: the training loop is the same in-process code. If Ray is not
initialised yet it is started with `num_cpus=num_workers` (on this project's 2-core machine:
2 workers, 1 CPU each), or joined when RAY_ADDRESS is set (trainers.backends.init_ray, through its worker groups);
set RAY_AUTH_MODE=disabled where Ray's token auth is not set up. The workers rendezvous on
127.0.0.1, so they must share one node.

Where we deviate from DR-Venus and why
* DR-Venus trains with a GPU framework (FSDP on a cluster). Here the same gradient
  arithmetic runs on any number of CPU or GPU workers with a hand-written all-reduce;
  sharded (FSDP) training is not implemented because the models trained here fit a worker.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from trainers.backends import WorkerSpec, backend_for, free_address
from trainers.distributed import WorkerGroup
from trainers.sft.config import SFTExperimentConfig, config_to_dict
from trainers.sft.packing import SFTSample
from trainers.sft.trainer import SFTTrainer, latest_checkpoint


class SFTWorker:
    """One data-parallel replica (instantiated as a Ray actor by train_data_parallel)."""

    def run(self, rank: int, world_size: int, address: str, config: SFTExperimentConfig,
            model: torch.nn.Module, samples: list[SFTSample], pad_id: int,
            max_steps: int | None, threads: int, save_at_end: bool) -> dict[str, Any]:
        if threads:
            torch.set_num_threads(threads)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank,
                                world_size=world_size)
        try:
            if backend == "nccl":
                model = model.to(f"cuda:{torch.cuda.current_device()}")
            trainer = SFTTrainer(model, samples, config.train, config.data, pad_id,
                                 config_record=config_to_dict(config))
            resume = config.train.resume
            if resume == "latest":
                resume = str(latest_checkpoint(config.train.output_dir) or "")
            if resume:
                trainer.load_checkpoint(resume)
            history = trainer.train(max_steps)
            if save_at_end:
                trainer.save_checkpoint()
            state = {name: tensor.detach().cpu().clone()
                     for name, tensor in model.state_dict().items()}
            return {"rank": rank, "history": history, "model": state, "step": trainer.step}
        finally:
            dist.destroy_process_group()


def train_data_parallel(config: SFTExperimentConfig, model: torch.nn.Module,
                        samples: list[SFTSample], pad_id: int, max_steps: int | None = None,
                        num_workers: int | None = None, save_at_end: bool = True,
                        return_all_replicas: bool = False) -> dict[str, Any]:
    """Train on `num_workers` (default config.train.num_workers) Ray actors.

    Returns rank 0's {"model": state_dict, "history": metrics per step, "step"}; with
    return_all_replicas also "replicas": every rank's result (for checking they agree).
    """
    workers = num_workers or config.train.num_workers
    # Workers inherit this process's environment; the package is importable from an install
    # (pip install -e .), so no runtime_env (which costs seconds per start). With
    # RAY_ADDRESS set (`ray job submit`) the cluster is joined, not started.
    backend = backend_for(use_ray=True, num_cpus=workers)
    threads = config.train.threads_per_worker or max(1, (os.cpu_count() or 1) // workers)
    group = WorkerGroup(backend, [WorkerSpec(SFTWorker, resources={"num_cpus": 1})] * workers,
                        role="SFT worker")
    model_ref, samples_ref = group.put(model), group.put(samples)
    address = free_address()
    try:
        results = group.call_each(SFTWorker.run, [
            (rank, workers, address, config, model_ref, samples_ref, pad_id, max_steps,
             threads, save_at_end) for rank in range(workers)])
    finally:
        group.shutdown()
    results.sort(key=lambda result: result["rank"])
    main = dict(results[0])
    if return_all_replicas:
        main["replicas"] = results
    return main
