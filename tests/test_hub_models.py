"""Hub ids as model paths: a model in the local Hugging Face cache (laid out here the way
huggingface_hub lays it out: blobs, refs/main, snapshots/COMMIT with symlinks) loads by its
id as an RL / eval policy and as an SFT base, with the network blocked; a snapshot
directory works as a plain directory; `warm-start` is an SFT base as well; an id that is
not cached fails naming what was tried; a GGUF-only snapshot stands for its .gguf file."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest
import torch
from huggingface_hub import scan_cache_dir
from transformers import AutoModelForCausalLM

from trainers.modeling.hub_cache import hub_cache_dir
from trainers.modeling.models import (
    build_chatml_tokenizer,
    build_tiny_causal_lm,
    load_policy,
    resolve_model_path,
)
from trainers.sft.config import ModelConfig
from trainers.sft.pipeline import build_model, build_tokenizer

REPO_ID = "venus-test/tiny-policy"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def lay_out_hub_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """A hub cache entry as huggingface_hub writes it; returns the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").mkdir()
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


@pytest.fixture()
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network call attempted: {args[1:]!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch, no_network):
    """A tiny policy saved with save_pretrained, then stored in a fresh hub cache."""
    tokenizer = build_chatml_tokenizer(["a small corpus for a small tokenizer"] * 4,
                                       vocab_size=300)
    model = build_tiny_causal_lm(tokenizer, hidden=32, layers=1)
    source = tmp_path / "saved"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    cache = tmp_path / "hub"
    snapshot = lay_out_hub_cache(cache, REPO_ID, {path.name: path.read_bytes()
                                                  for path in source.iterdir()})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return {"cache": cache, "snapshot": snapshot, "model": model, "tokenizer": tokenizer}


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_the_cache_is_laid_out_as_huggingface_hub_lays_it_out(hub_cache):
    info = scan_cache_dir(hub_cache["cache"])
    (repo,) = info.repos
    assert repo.repo_id == REPO_ID and repo.repo_type == "model"
    (revision,) = repo.revisions
    assert revision.commit_hash == COMMIT and revision.refs == frozenset({"main"})
    assert {f.file_name for f in revision.files} >= {"config.json", "model.safetensors",
                                                     "tokenizer.json"}
    # transformers itself finds it by id, offline
    direct = AutoModelForCausalLM.from_pretrained(REPO_ID, cache_dir=hub_cache["cache"],
                                                  local_files_only=True)
    assert torch.equal(logits(direct, [3, 4, 5]), logits(hub_cache["model"], [3, 4, 5]))


def test_a_cached_hub_id_is_a_policy_and_an_sft_base(hub_cache):
    assert hub_cache_dir() == hub_cache["cache"]
    assert resolve_model_path(REPO_ID) == hub_cache["snapshot"]
    ids = hub_cache["tokenizer"]("a small corpus")["input_ids"]
    expected = logits(hub_cache["model"], ids)

    # RL / eval: load_policy is what the workers, learners and `venus-gym eval` call
    model, tokenizer, chat = load_policy(REPO_ID)
    assert model.training and tokenizer("a small corpus")["input_ids"] == ids
    assert torch.equal(logits(model.eval(), ids), expected)

    # SFT: model.name and model.tokenizer
    config = ModelConfig(name=REPO_ID, tokenizer="model")
    sft_tokenizer = build_tokenizer(config, {})
    assert sft_tokenizer("a small corpus")["input_ids"] == ids
    sft_model = build_model(config, sft_tokenizer)
    assert torch.equal(logits(sft_model.eval(), ids), expected)
    other = build_tokenizer(ModelConfig(name="tiny", tokenizer=REPO_ID), {})
    assert other("a small corpus")["input_ids"] == ids

    # the snapshot directory itself is a plain model directory
    model, _, _ = load_policy(hub_cache["snapshot"])
    assert torch.equal(logits(model.eval(), ids), expected)


def test_the_packaged_warm_start_is_an_sft_base_too():
    from trainers.modeling.models import load_causal_lm, warm_start_dir

    config = ModelConfig(name="warm-start", tokenizer="model")
    tokenizer = build_tokenizer(config, {})
    model = build_model(config, tokenizer)
    packaged = load_causal_lm(warm_start_dir())
    ids = tokenizer("a small corpus")["input_ids"]
    assert torch.equal(logits(model.eval(), ids), logits(packaged, ids))


def test_an_id_that_is_not_cached_fails_naming_what_was_tried(hub_cache):
    with pytest.raises(FileNotFoundError) as caught:
        load_policy("venus-test/absent")
    message = str(caught.value)
    assert "policy.path 'venus-test/absent' is neither a GGUF file nor a directory" in message
    assert str(hub_cache["cache"]) in message
    assert "models--venus-test--absent is not there" in message
    assert "hf download venus-test/absent" in message

    with pytest.raises(FileNotFoundError, match="not a Hugging Face hub id either"):
        load_policy("runs/some/missing/final")
    with pytest.raises(ValueError, match="model.name must be 'tiny', 'smollm2' or a model "
                                         "that loads offline.*models--venus-test--absent"):
        build_model(ModelConfig(name="venus-test/absent"), hub_cache["tokenizer"])


def test_an_incomplete_snapshot_is_not_a_model(hub_cache):
    lay_out_hub_cache(hub_cache["cache"], "venus-test/weights-only",
                      {"model.safetensors": b"x"})
    assert resolve_model_path("venus-test/weights-only") == Path("venus-test/weights-only")
    with pytest.raises(FileNotFoundError, match="holds neither config.json nor exactly one "
                                                ".gguf file"):
        load_policy("venus-test/weights-only")


def test_a_gguf_only_snapshot_stands_for_its_gguf_file(hub_cache):
    snapshot = lay_out_hub_cache(hub_cache["cache"], "venus-test/gguf-only",
                                 {"model.Q4_1.gguf": b"GGUF", "README.md": b"card"})
    resolved = resolve_model_path("venus-test/gguf-only")
    assert resolved == snapshot / "model.Q4_1.gguf" and resolved.is_file()
