"""Exporting what a node trained, for use outside SAPO: `sapo export --out DIR`.

Into one new folder:
  adapter_config.json + adapter_model.safetensors   the LoRA adapter in PEFT format (models trained
      through LoRA: the catalog's), loadable with `PeftModel.from_pretrained(base, DIR)`; or, for
      fully fine-tuned models (the seed, a model directory), the whole model in transformers format.
  <model>-sapo-r<round>-<type>.gguf   base + adapter merged, one file for llama.cpp, Ollama, LM Studio.
  Modelfile, README.md                 how to load it, what it is, its license (the base model's).

The GGUF is the base's own float GGUF (the node's cached conversion, or a float copy of a GGUF base)
with the trained tensors written in place (`gguf_convert.refresh_weights`): the base's tokenizer and
chat template stay exactly as llama.cpp knows them, and no second conversion runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import checkpoint
from engine.checkpoint import CheckpointError, latest_checkpoint, load_weights, read_state
from engine.errors import SapoError
from engine.models import catalog
from engine.models.backends import convert_cached, dequantized_cached, load_gguf_policy
from engine.models.catalog import resolve_model_id
from engine.models.gguf_convert import GgufError, base_param_name, derive_plan, lora_pairs, refresh_weights
from engine.models.policy import LoraSpec, load_policy
from engine.paths import SEED_MODEL_DIR
from engine.settings import ContributorSettings
from engine.tasks.prompts import DEFAULT_SYSTEM

GGUF_TYPES = ("f16", "bf16", "f32")  # float types both the converter and a GGUF base's float copy give
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model"]  # what resolve_model downloads

Progress = Callable[[str], None]


class ExportError(SapoError, RuntimeError):
    """What cannot be exported and what to do about it, in words (the CLI prints it, no traceback)."""


@dataclass(frozen=True)
class Base:
    """The model a checkpoint was trained from."""

    model: str  # as the node was given it (catalog id, alias, "seed" or a directory): its checkpoint folder key
    model_id: str  # as checkpoints and the store record it
    kind: str  # "gguf" (a catalog GGUF build), "hub" (a catalog transformers model) or "dir" (seed, a folder)
    path: Path  # the GGUF file or the model directory
    spec: Any  # its catalog.ModelSpec, None for a folder


@dataclass(frozen=True)
class ExportResult:
    out: Path
    model_id: str
    round: int  # rounds completed when the checkpoint was written
    updates: int  # optimizer steps (policy version) in the weights
    lora: bool  # a PEFT adapter was written (else the whole model in transformers format)
    gguf: Path
    files: tuple[str, ...]


def _quiet(message: str) -> None:
    return None


def export_model(data_dir: str | Path, out: str | Path, *, model: str | None = None, gguf_type: str = "f16",
                 progress: Progress = _quiet) -> ExportResult:
    """Export the newest checkpoint of `model` (default: what the node trains) into the new folder `out`.
    Raises ExportError, with what to do, for anything the caller cannot fix by retrying blindly."""
    if gguf_type not in GGUF_TYPES:
        raise ExportError(f"the GGUF type must be one of {', '.join(GGUF_TYPES)}, got {gguf_type!r}")
    data_dir, out = Path(data_dir).expanduser(), Path(out).expanduser().absolute()
    if not data_dir.is_dir():
        raise ExportError(f"no data dir at {data_dir}: pass the node's --data-dir")
    _check_out(out)
    chosen = model or default_model(data_dir)
    ckpt, state = find_checkpoint(data_dir, chosen)  # first: its error lists the models trained here
    base = locate_base(chosen)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        result = _write_all(base, ckpt, state, data_dir, work, gguf_type, progress)
        if out.exists():
            out.rmdir()  # checked empty above; the finished folder takes its place whole
        os.replace(work, out)
    except ImportError as exc:
        raise ExportError(f"a GGUF export needs llama.cpp's Python packages ({exc.name} is missing): "
                          "pip install -e '.[llamacpp]'") from exc
    except (GgufError, CheckpointError, OSError, ValueError) as exc:
        raise ExportError(f"export of {base.model_id} failed: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"done: {out}")
    return ExportResult(out, base.model_id, state["round"], state["policy_version"], result["lora"],
                        out / result["gguf"], tuple(sorted(p.name for p in out.iterdir())))


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} is not an empty folder: choose a new one (an export never overwrites files)")


def default_model(data_dir: Path) -> str:
    """The model the node trains: the settings' choice, else the one its checkpoint folder belongs to."""
    try:
        chosen = ContributorSettings.load(data_dir).model
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read {data_dir / 'settings.toml'} ({exc}): name the model with --model") from exc
    if chosen:
        return chosen
    record = data_dir / "checkpoints" / checkpoint.ROOT_MODEL_FILE
    owner = record.read_text(encoding="utf-8").strip() if record.is_file() else ""
    if owner:
        return owner
    newest = latest_checkpoint(data_dir / "checkpoints")
    if newest is not None:  # a data dir from before the owner record: its checkpoints say
        recorded = _read_state(newest)["extra"].get("model_id")
        if isinstance(recorded, str) and recorded:
            return recorded
    raise ExportError(f"nothing has been trained in {data_dir} yet (no checkpoints): train a model first "
                      "(Join in the app, or `sapo run`), or pass the node's --data-dir")


def find_checkpoint(data_dir: Path, model: str) -> tuple[Path, dict[str, Any]]:
    """The newest complete checkpoint of `model` and its state; the folder is found as the node finds it
    (without writing the owner record the node's own lookup would create)."""
    base = data_dir / "checkpoints"
    tried: list[Path] = []
    for key in dict.fromkeys([model, resolve_model_id(model)]):
        folder = checkpoint.checkpoint_dir_for(base, key, key) if (base / checkpoint.ROOT_MODEL_FILE).is_file() else base
        newest = latest_checkpoint(folder)
        if newest is not None:
            state = _read_state(newest)
            if state["extra"].get("model_id") in (None, model_id_of(model)):  # else another model's folder
                return newest, state
        tried.append(folder)
    others = trained_models(data_dir)
    raise ExportError(f"no checkpoint of {model} in {' or '.join(map(str, dict.fromkeys(tried)))}: train it first "
                      "(a node writes one every few rounds and when it stops), or name another with --model"
                      + (f" (checkpoints here: {', '.join(others)})" if others else ""))


def model_id_of(model: str) -> str:
    """The id checkpoints record for `model` (as the node's loader names it)."""
    key = resolve_model_id(model.strip())
    folder = Path(key).expanduser()
    return folder.name if key != "seed" and folder.is_dir() else key


def trained_models(data_dir: Path) -> list[str]:
    """The ids of the models with a checkpoint in this data dir (what --model could name)."""
    base = data_dir / "checkpoints"
    found = []
    for folder in [base, *sorted(p for p in (base / "models").glob("*") if p.is_dir())]:
        newest = latest_checkpoint(folder)
        if newest is not None:
            try:
                found.append(str(read_state(newest)["extra"].get("model_id") or folder.name))
            except CheckpointError:
                continue
    return found


def _read_state(path: Path) -> dict[str, Any]:
    try:
        return read_state(path)
    except CheckpointError as exc:
        raise ExportError(f"the checkpoint cannot be read: {exc}") from exc


def locate_base(model: str) -> Base:
    """Where the base weights of `model` are on this machine (never downloads: the node already did)."""
    key = resolve_model_id(model.strip())
    if key == "seed":
        if not (SEED_MODEL_DIR / "config.json").is_file():
            raise ExportError(f"the seed model is not on this machine ({SEED_MODEL_DIR})")
        return Base(model, "seed", "dir", SEED_MODEL_DIR, catalog.seed_spec())
    folder = Path(key).expanduser()
    if folder.is_dir():
        return Base(model, folder.name, "dir", folder.resolve(), None)
    try:
        spec = catalog.get(key)
    except KeyError as exc:
        raise ExportError(f"{model!r} is neither a model folder on this machine nor a catalog model: {exc.args[0]}") \
            from None
    if spec.is_gguf:
        if spec.local_path is None or not Path(spec.local_path).is_file():
            raise ExportError(f"{spec.id}: its GGUF file is not on this machine (the base the adapter belongs to)")
        return Base(model, spec.id, "gguf", Path(spec.local_path), spec)
    if spec.hf_repo is None:
        raise ExportError(f"{spec.id} names no base weights to export from")
    from huggingface_hub import snapshot_download

    try:
        local = snapshot_download(spec.hf_repo, allow_patterns=HUB_PATTERNS, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 -- the hub's "not cached" errors have no common base but Exception
        raise ExportError(f"{spec.id}: its base weights are not cached on this machine ({type(exc).__name__})") \
            from None
    return Base(model, spec.id, "hub", Path(local), spec)


def lora_spec_of(ckpt: Path, state: dict[str, Any]) -> LoraSpec | None:
    """The LoRA adapter a checkpoint holds (None: full weights). Rank and target modules come from the
    tensors; alpha is not in them: the checkpoint's record if any, else the node's (LoraSpec's) default."""
    from safetensors import safe_open

    with safe_open(str(ckpt / "weights.safetensors"), framework="pt") as f:
        names = f.keys()  # a safe_open handle is not iterable itself
        shapes = {k: f.get_slice(k).get_shape() for k in names if ".lora_A." in k}
    if not shapes:
        return None
    targets = tuple(sorted({k.split(".lora_A.")[0].rsplit(".", 1)[-1] for k in shapes}))
    saved = state["extra"].get("lora")
    alpha = saved.get("alpha") if isinstance(saved, dict) else None
    return LoraSpec(r=int(next(iter(shapes.values()))[0]), alpha=int(alpha or LoraSpec().alpha),
                    target_modules=targets)


def _write_all(base: Base, ckpt: Path, state: dict[str, Any], data_dir: Path, work: Path, gguf_type: str,
               progress: Progress) -> dict[str, Any]:
    lora = lora_spec_of(ckpt, state)
    progress(f"loading the base model {base.model_id} ({base.path.name})")
    policy, tokenizer = _load_base(base, lora)
    progress(f"preparing a {gguf_type} GGUF of the base (cached after the first export)")
    converted = data_dir / "models" / "llamacpp" / "converted"  # the node's conversion cache
    template = (dequantized_cached(base.path, converted, gguf_type) if base.kind == "gguf"
                else convert_cached(base.path, converted, gguf_type))
    plan = derive_plan(template, policy.state_dict())  # checked against the base, before training's weights
    progress(f"loading the trained weights (round {state['round']}, {state['policy_version']} updates)")
    load_weights(ckpt, policy)
    trained = set(lora_pairs(policy)) if lora else {base_param_name(n) for n, p in policy.named_parameters()
                                                    if p.requires_grad}
    missing = sorted(trained - {e.hf_name for e in plan.entries})
    if missing:
        raise GgufError(f"the GGUF holds no tensor for trained weights {missing[:3]}")
    if lora is not None:
        progress("writing the LoRA adapter (PEFT format)")
        policy.save_pretrained(work, save_embedding_layers=False)  # "auto" would ask the hub about the base
        _point_adapter_at_base(work / "adapter_config.json", base)
        merged = policy.merge_and_unload()
    else:
        progress("writing the trained model (transformers format)")
        policy.save_pretrained(work)
        tokenizer.save_pretrained(work)
        merged = policy
    name = f"{_slug(base.model_id)}-sapo-r{state['round']}-{gguf_type}.gguf"
    progress(f"writing the merged GGUF {name}")
    refresh_weights(template, plan, merged.state_dict(), work / name)
    style = str(state["extra"].get("config", {}).get("prompt_style") or "")
    (work / "Modelfile").write_text(modelfile(name, style), encoding="utf-8")
    license_note = _license(base, work)
    facts = store_facts(data_dir / "node.db", base.model_id, state["round"])
    (work / "README.md").write_text(readme(base, state, name, lora, license_note, facts, style), encoding="utf-8")
    return {"lora": lora is not None, "gguf": name}


def _load_base(base: Base, lora: LoraSpec | None) -> tuple[Any, Any]:
    if base.kind == "gguf":
        if lora is None:
            raise ExportError(f"the checkpoint of {base.model_id} holds no LoRA adapter, yet a GGUF base only "
                              "trains through one: it belongs to another model")
        return load_gguf_policy(base.path, device="cpu", lora=lora)
    return load_policy(base.path, device="cpu", dtype="float32", lora=lora)


def _point_adapter_at_base(config_path: Path, base: Base) -> None:
    """peft records the local folder it loaded; a catalog base is better named by its hub repo."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base.spec.hf_repo if base.spec is not None and base.spec.hf_repo \
        else str(base.path)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:64] or "model"


def store_facts(db: Path, model_id: str, up_to: int) -> dict[str, Any]:
    """Rounds and held-out pass@1 the node's store holds for this model up to the checkpoint's round.
    Read-only (a node may be running, and an export must not migrate or create its store); {} if none."""
    if not db.is_file():
        return {}
    try:
        con = sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True, timeout=5.0)
        try:
            rounds = con.execute("SELECT COUNT(*) FROM rounds WHERE model = ? AND round <= ?",
                                 (model_id, up_to)).fetchone()[0]
            evals = con.execute("SELECT round, pass1 FROM evals WHERE kind = 'heldout' AND model = ? "
                                "AND round <= ? ORDER BY round, id", (model_id, up_to)).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return {}
    facts: dict[str, Any] = {"rounds": int(rounds)}
    if evals:
        facts["first_eval"], facts["last_eval"] = tuple(evals[0]), tuple(evals[-1])
    return facts


def _license(base: Base, work: Path) -> str:
    spec = base.spec
    if spec is not None and spec.license:
        where = f" ([{spec.hf_repo}](https://huggingface.co/{spec.hf_repo}))" if spec.hf_repo else ""
        return (f"**{spec.license}**, the base model's license{where}. These weights are a fine-tune of it "
                "and carry its terms.")
    for name in ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE"):
        if (base.path / name).is_file():
            shutil.copyfile(base.path / name, work / "LICENSE")
            return "the base model's own license, copied here as `LICENSE`; these weights carry its terms."
    return (f"unknown: the base model's folder ({base.path}) names none. Check the base model's terms before "
            "sharing this export: a fine-tune carries them.")


def modelfile(gguf_name: str, prompt_style: str) -> str:
    """An Ollama Modelfile. Chat models keep the chat template the GGUF holds and get the system line
    they were trained with; the others complete raw prompts, as they were trained."""
    lines = [f"FROM ./{gguf_name}"]
    if prompt_style == "chat-fewshot":
        lines.append(f'SYSTEM """{DEFAULT_SYSTEM}"""')
    if not prompt_style.startswith("chat"):
        lines.append('TEMPLATE """{{ .Prompt }}"""')
    return "\n".join(lines) + "\n"


def _eval_line(facts: dict[str, Any]) -> str:
    if "last_eval" not in facts:
        return "No held-out evaluation was recorded for this model on the node."
    r1, p1 = facts["first_eval"]
    r2, p2 = facts["last_eval"]
    line = f"Held-out pass@1 (share of unseen questions solved, sampled): **{p2:.1%}** at round {r2}"
    return line + (f", up from {p1:.1%} at round {r1} (first measured)." if r1 != r2 else ".")


def readme(base: Base, state: dict[str, Any], gguf: str, lora: LoraSpec | None, license_note: str,
           facts: dict[str, Any], style: str) -> str:
    title = base.spec.display_name.split(" GGUF")[0] if base.spec is not None else base.model_id
    rounds = f"; {facts['rounds']} of its rounds are in the node's history" if facts.get("rounds") else ""
    kind = (f"a LoRA adapter (rank {lora.r}, alpha {lora.alpha}, on {', '.join(lora.target_modules)})"
            if lora is not None else "all of its weights (full fine-tuning)")
    what = "`adapter_config.json`, `adapter_model.safetensors`: the LoRA adapter in PEFT format" if lora \
        else "`config.json`, `model.safetensors`, tokenizer files: the trained model in transformers format"
    slug = _slug(base.model_id).lower()
    quant_note = (f"\nThe base was the {base.spec.gguf_quant} GGUF build, dequantized; the adapter learned on those "
                  "weights, and the merged GGUF holds exactly them plus the adapter.\n"
                  if base.kind == "gguf" else "")
    hint = (f'Trained with a system line, "{DEFAULT_SYSTEM}", and solved examples before each question: '
            "prompt it the same way for the best answers." if style == "chat-fewshot" else
            "Trained to give its final answer inside `<answer>…</answer>` tags.")
    peft = (f"\n```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM\n"
            f"base = AutoModelForCausalLM.from_pretrained(\"{_adapter_base(base)}\")\n"
            "model = PeftModel.from_pretrained(base, \"path/to/this/folder\")  # or .merge_and_unload()\n```\n"
            if lora else "\n```python\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained(\"path/to/this/folder\")\n```\n")
    return f"""# {title}, trained with SAPO Swarm

{title} ({base.model_id}) fine-tuned by reinforcement learning on a SAPO Swarm node: it answered
verifiable questions (arithmetic, number bases, fractions and the like), its answers were checked, and
{kind} learned from the rewards, in a swarm that shares rollouts.

- Checkpoint of round {state['round']}: {state['policy_version']} policy updates{rounds}.
- {_eval_line(facts)}
- {hint}
{quant_note}
## Files

- `{gguf}`: the base model with the training merged in, one GGUF file ({gguf.rsplit('-', 1)[-1][:-5]}) for
  llama.cpp, Ollama and LM Studio.
- {what}.
- `Modelfile`: for Ollama.

## Use it

llama.cpp: `llama-cli -m {gguf} -p "What is 12 + 30?"`, or serve it: `llama-server -m {gguf}`.
From Python: `llama_cpp.Llama(model_path="{gguf}")`.

Ollama, in this folder: `ollama create sapo-{slug} -f Modelfile`, then `ollama run sapo-{slug}`.

LM Studio: `lms import {gguf}` (or copy the file under `~/.lmstudio/models/sapo/{slug}/`), then load it.

transformers:
{peft}
## License

{license_note}
"""


def _adapter_base(base: Base) -> str:
    return base.spec.hf_repo if base.spec is not None and base.spec.hf_repo else str(base.path)
