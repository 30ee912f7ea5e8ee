"""Hugging Face hub ids as model paths, from the local cache only.

`policy.path: Qwen/Qwen3-0.6B` (RL), `model.name: Qwen/Qwen3-0.6B` (SFT) and
`venus-gym eval --policy Qwen/Qwen3-0.6B` name a model by its hub id, as transformers does.
The id is looked up in the local hub cache (laid out by huggingface_hub: `models--ORG--NAME/
refs/main` holding a commit, `snapshots/COMMIT/` the files) and stands for that snapshot
directory, so everything that reads a model directory (the transformers and vLLM engines,
tokenizer loading, GGUF conversion) reads the cached files. Nothing is ever downloaded:
the lookup is `huggingface_hub.snapshot_download(..., local_files_only=True)`, which makes
no network call whatever HF_HUB_OFFLINE says. Download a model once with
`hf download ORG/NAME`.

A snapshot holding a config.json is a transformers model; one holding no config.json but
exactly one .gguf file stands for that file (GGUF-only repositories).

The cache directory is read when a path is resolved, not at import: HF_HUB_CACHE, else
HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub (huggingface_hub's
own order).
"""

from __future__ import annotations

import os
from pathlib import Path

HUB_DOWNLOAD_HINT = "hf download {repo_id}"


def hub_cache_dir() -> Path:
    """The hub cache directory huggingface_hub uses, from the environment as it is now."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.path.expandvars(os.path.expanduser(os.environ[variable])))
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


def is_hub_id(spec: str) -> bool:
    """Whether `spec` is shaped like a hub model id ("name" or "org/name")."""
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        return False
    try:
        validate_repo_id(spec)
    except HFValidationError:
        return False
    return True


def cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot directory of `repo_id`'s main revision, or None (not cached, or
    not a hub id). Never touches the network."""
    if not is_hub_id(repo_id):
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, cache_dir=hub_cache_dir(),
                                      local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None


def cached_model(repo_id: str) -> Path | None:
    """The model `repo_id` stands for in the local cache: its snapshot directory when that
    holds config.json, else the snapshot's one .gguf file; None when neither is cached."""
    snapshot = cached_snapshot(repo_id)
    if snapshot is None:
        return None
    if (snapshot / "config.json").is_file():
        return snapshot
    ggufs = sorted(snapshot.glob("*.gguf"))
    return ggufs[0] if len(ggufs) == 1 else None


def cache_miss_reason(spec: str) -> str:
    """Why `spec` is not a cached hub model, for error messages (what was looked at)."""
    if not is_hub_id(spec):
        return "not a Hugging Face hub id either ('name' or 'org/name')"
    cache = hub_cache_dir()
    folder = cache / ("models--" + spec.replace("/", "--"))
    if not folder.is_dir():
        found = f"{folder.name} is not there"
    else:
        snapshot = cached_snapshot(spec)
        if snapshot is None:
            found = f"{folder.name} holds no complete snapshot of its main revision"
        else:
            found = (f"its snapshot {snapshot} holds neither config.json nor exactly one "
                     ".gguf file")
    return (f"and not in the local Hugging Face cache {cache} ({found}); nothing is "
            f"downloaded: fetch it once with `{HUB_DOWNLOAD_HINT.format(repo_id=spec)}`")
