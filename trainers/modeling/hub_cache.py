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

What the cache names stays inside it: `refs/main` must hold a commit hash (or another plain
snapshot name), not a path, and the snapshot directory and every file in it must resolve
inside the cache (huggingface_hub's own symlinks into the repo's blobs/ do). A ref such as
`../../../outside`, or a snapshot or config.json linked elsewhere, is refused with a
one-line UnsafeCacheEntry naming it, instead of loading a model from wherever it points.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HUB_DOWNLOAD_HINT = "hf download {repo_id}"
# What huggingface_hub writes into refs/<revision>; a plain name is accepted as well (it
# stays inside snapshots/), never a path.
_SNAPSHOT_NAME = re.compile(r"(?![.]{1,2}$)[\w.-]{1,255}")


class UnsafeCacheEntry(ValueError):
    """A hub cache entry that points outside the cache (a ref that is a path, a snapshot or
    file linked elsewhere): refused, not loaded."""


def path_exists(path: str | Path) -> bool:
    """Path.exists, but False (not OSError) for a name no file can have, e.g. one longer
    than the file system allows: a 5,000-character model id is no path, not a crash."""
    try:
        return Path(path).exists()
    except OSError:
        return False


def _inside(path: str | Path, root: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


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


def _check_ref(repo_id: str, folder: Path, root: str) -> None:
    """Refuse a refs/main that lies outside the cache or names anything but a snapshot of
    this repo: huggingface_hub joins it onto snapshots/ as it is."""
    ref_file = folder / "refs" / "main"
    if not ref_file.is_file():
        return  # not cached: snapshot_download says so
    if not _inside(ref_file, root):
        raise UnsafeCacheEntry(f"hub id {repo_id!r}: its ref {ref_file} links to "
                               f"{os.path.realpath(ref_file)}, outside the Hugging Face cache "
                               f"{root}; refusing to load a model through it")
    ref = ref_file.read_text(encoding="utf-8", errors="replace")
    if not _SNAPSHOT_NAME.fullmatch(ref.strip()):  # a trailing newline makes no path
        raise UnsafeCacheEntry(f"hub id {repo_id!r}: its ref {ref_file} holds {ref[:100]!r}, "
                               "not a commit hash; refusing it, as a path there can lead "
                               "outside the Hugging Face cache (re-fetch the model with "
                               f"`{HUB_DOWNLOAD_HINT.format(repo_id=repo_id)}`)")


def _check_contained(repo_id: str, snapshot: Path, root: str) -> None:
    """Refuse a snapshot whose directory, or any file or folder in it, resolves outside the
    cache (the loaders open whatever the snapshot holds)."""
    def refuse(path: str) -> UnsafeCacheEntry:
        return UnsafeCacheEntry(f"hub id {repo_id!r}: {path} (snapshot {snapshot.name} of ref "
                                f"main) links to {os.path.realpath(path)}, outside the Hugging "
                                f"Face cache {root}; refusing to load it")

    if not _inside(snapshot, root):
        raise refuse(str(snapshot))
    seen = set()
    for directory, folders, files in os.walk(snapshot, followlinks=True):
        real = os.path.realpath(directory)
        if real in seen:  # a link back up: walked already
            folders.clear()
            continue
        seen.add(real)
        for name in folders + files:
            if not _inside(os.path.join(directory, name), root):
                raise refuse(os.path.join(directory, name))


def cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot directory of `repo_id`'s main revision, or None (not cached, or
    not a hub id). Never touches the network.

    Raises:
        UnsafeCacheEntry: the ref, the snapshot or a file in it lies outside the cache.
    """
    if not is_hub_id(repo_id):
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    root = os.path.realpath(cache)
    _check_ref(repo_id, cache / ("models--" + repo_id.replace("/", "--")), root)
    try:
        snapshot = Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None
    _check_contained(repo_id, snapshot, root)
    return snapshot


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
