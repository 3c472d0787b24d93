"""Hugging Face hub names -> a local folder of GPT-2 weights, through `huggingface_hub`: the local
cache first, then (when the hub is reachable and downloads are not switched off) a download.

A name is a repository id (`openai-community/gpt2`, `someone/my-gpt2`) or one of GPT-2's short names
(`gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`, `distilgpt2`), which the hub now serves under
`openai-community/` (and `distilbert/`). A path that exists is never a name: a local folder called
`gpt2` is that folder. The cache is huggingface_hub's own (`HF_HUB_CACHE`, else `HF_HOME/hub`), laid
out as it lays it out (`models--ORG--NAME/refs/main` naming a snapshot under `snapshots/`), so weights
that `hf download` or `transformers` fetched are found here too, and the other way round.

Only the files a GPT-2 needs are downloaded: config.json and the safetensors weights (one file or a
sharded index), or pytorch_model.bin when a repository has no safetensors.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Callable

from gpt2ladder.errors import LadderError, UsageError

SHORT_NAMES = {
    "gpt2": "openai-community/gpt2", "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large", "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}
# The hub's rule for a model id: an owner and a name of letters, digits, '-', '_' and '.'.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
_FILE_SUFFIXES = (".pt", ".bin", ".safetensors", ".json", ".txt")  # what a mistyped local path ends in
# What each download fetches, in order: the second only when a repository has no safetensors weights.
DOWNLOADS = (["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json"],
             ["config.json", "generation_config.json", "pytorch_model*.bin", "pytorch_model.bin.index.json"])


def is_hub_name(text: str) -> bool:
    """Whether `text` names a hub model rather than a local path: no local path could be meant, and it is a
    short name or has the form OWNER/NAME (not a file name, not absolute, not starting with '.' or '~').
    A path that exists, or whose first folder does (runs/ref10 beside runs/ref100), is a path, mistyped or not."""
    path = Path(text).expanduser()
    if path.exists() or (len(path.parts) > 1 and Path(path.parts[0]).exists()):
        return False
    if text in SHORT_NAMES:
        return True
    return bool(_REPO_ID.fullmatch(text)) and not text.lower().endswith(_FILE_SUFFIXES)


def repo_id(name: str) -> str:
    """The repository a name stands for: a short name's openai-community/ id, else the name itself."""
    return SHORT_NAMES.get(name, name)


def hf_cache_dir() -> Path:
    """huggingface_hub's cache folder, read from the environment now (the library reads it once, at
    import, so a process that sets HF_HOME or HF_HUB_CACHE later would otherwise look elsewhere)."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.path.expandvars(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"])).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                               "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value, now or when huggingface_hub was imported."""
    values = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    if any((v or "").strip().upper() in ("1", "ON", "YES", "TRUE") for v in values):
        return True
    constants = sys.modules.get("huggingface_hub.constants")
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def fetch_command(name: str) -> str:
    """The shell command that puts a model's GPT-2 files into the cache."""
    return f'hf download {repo_id(name)} --include "*.json" --include "*.safetensors"'


def cached_folder(name: str, usable: Callable[[Path], bool]) -> Path | None:
    """The cached snapshot of `name` (as given, then under its openai-community/ id) that holds a
    config.json and weights `usable` accepts, or None. Never touches the network."""
    hub = _hub()
    for repo in dict.fromkeys([name, repo_id(name)]):  # a short name may be cached under either id
        try:
            config = hub.try_to_load_from_cache(repo, "config.json", cache_dir=str(hf_cache_dir()))
        except ValueError:  # not a valid repository id after all
            return None
        if isinstance(config, str) and usable(Path(config).parent):
            return Path(config).parent
    return None


def resolve(name: str, usable: Callable[[Path], bool]) -> Path:
    """A local folder holding `name`'s config.json and weights: the cache's, else a fresh download (with
    huggingface_hub's own progress bars, on a terminal).

    Offline (HF_HUB_OFFLINE) with nothing usable cached, one line naming the command that fetches it.
    """
    folder = cached_folder(name, usable)
    if folder is not None:
        return folder
    if offline():
        raise UsageError(f"{name} is neither a path here nor a model in the Hugging Face cache ({hf_cache_dir()}), "
                         f"and HF_HUB_OFFLINE is set, so it cannot be downloaded; fetch it with: {fetch_command(name)}")
    for patterns in DOWNLOADS:
        folder = _download(name, patterns)
        if usable(folder):
            return folder
    raise UsageError(f"the Hugging Face repository {repo_id(name)} holds no GPT-2 weights gpt2ladder reads "
                     "(config.json with model.safetensors, a sharded model.safetensors.index.json or "
                     "pytorch_model.bin)")


def _download(name: str, patterns: list[str]) -> Path:
    hub, errors = _hub(), _errors()
    repo = repo_id(name)
    try:
        return Path(hub.snapshot_download(repo, allow_patterns=patterns, cache_dir=str(hf_cache_dir())))
    except errors.GatedRepoError:
        raise UsageError(f"{repo} is gated on the Hugging Face hub: accept its terms on its page and log in "
                         "with `hf auth login` (or set HF_TOKEN)") from None
    except errors.RepositoryNotFoundError:
        raise UsageError(f"no run directory, checkpoint or folder at {name}, and no model {repo} on the "
                         "Hugging Face hub (or it is private: log in with `hf auth login`)") from None
    except errors.LocalEntryNotFoundError as err:  # huggingface_hub's word for "the hub cannot be reached"
        raise LadderError(f"cannot reach the Hugging Face hub to download {repo} ({_first_line(err)}); on a "
                          f"machine with a network run: {fetch_command(name)}") from None
    except (errors.HfHubHTTPError, OSError) as err:
        raise LadderError(f"downloading {repo} from the Hugging Face hub failed: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


def _hub():
    """huggingface_hub, imported on first use (it is not needed for local files), or one line."""
    try:
        import huggingface_hub
    except ImportError:
        raise UsageError("hub names need the huggingface_hub package: pip install huggingface_hub") from None
    return huggingface_hub


def _errors():
    _hub()
    from huggingface_hub import errors

    return errors


def known_repo(text: str | None) -> str | None:
    """The hub repository a model name or path stands for, when that is known for sure: a short name, a
    path inside the Hugging Face cache (models--ORG--NAME/snapshots/...), or an OWNER/NAME that is no
    local path and is in the cache (as a name `train --init-from` read leaves it); else None."""
    if not text:
        return None
    if text in SHORT_NAMES:
        return SHORT_NAMES[text]
    parts = Path(text).expanduser().parts
    for part, after in zip(parts, parts[1:]):
        if part.startswith("models--") and after == "snapshots":
            return part.removeprefix("models--").replace("--", "/", 1)
    if is_hub_name(text) and (hf_cache_dir() / f"models--{text.replace('/', '--')}").is_dir():
        return text
    return None


# --- pushing -------------------------------------------------------------------------------------

_PUSH_NAME = re.compile(r"([A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}")


def check_push(repo: str) -> None:
    """UsageError before any work when `repo` cannot be pushed to: not a repository name, or offline."""
    if not _PUSH_NAME.fullmatch(repo) or repo.endswith((".git", ".")) or ".." in repo:
        raise UsageError(f"--push-to-hub {repo!r} is not a Hugging Face repository name (OWNER/NAME, or NAME "
                         "under your own account: letters, digits, '-', '_' and '.')")
    if offline():
        raise UsageError("--push-to-hub needs the network, and HF_HUB_OFFLINE is set")
    _hub()


def push_folder(folder: Path, repo: str, message: str) -> str:
    """Upload `folder` as the model repository `repo` (created if missing, kept if it exists); its URL."""
    hub, errors = _hub(), _errors()
    api = hub.HfApi()
    try:
        url = api.create_repo(repo_id=repo, repo_type="model", exist_ok=True)
        repo = getattr(url, "repo_id", None) or repo  # NAME alone becomes OWNER/NAME
        api.upload_folder(repo_id=repo, folder_path=str(folder), repo_type="model", commit_message=message)
    except errors.HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (401, 403):
            raise LadderError(f"the Hugging Face hub refused to let this account write {repo} ({status}); log in "
                              "with `hf auth login` or set HF_TOKEN to a token that can write") from None
        raise LadderError(f"pushing to {repo} on the Hugging Face hub failed: {_first_line(err)}") from None
    except (OSError, ValueError) as err:  # no network, no token, a name the hub refuses
        raise LadderError(f"pushing to {repo} on the Hugging Face hub failed: {_first_line(err)}") from None
    return f"https://huggingface.co/{repo}"
