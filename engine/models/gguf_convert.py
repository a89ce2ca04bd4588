"""GGUF files for llama.cpp generation: the vendor converter, fast weight refresh, LoRA adapters.

1. llama.cpp's HF -> GGUF converter, fetched from the llama-cpp-python sdist and run in a subprocess
   (`engine.models.gguf_vendor`, re-exported here: `ensure_converter`, `convert_hf_to_gguf`).
2. `derive_plan` learns which policy parameter each GGUF tensor holds and how it was rearranged (the
   converter permutes the rows of Llama q/k projections into GGML's interleaved rotary layout), by
   checking the file against the very weights it was made from. Nothing is assumed: a tensor that
   no candidate reproduces makes the plan fail, and callers fall back to the converter.
3. With a plan, `refresh_weights` rewrites a GGUF from updated weights in milliseconds (full
   fine-tuning), and `write_lora_adapter` writes a PEFT LoRA adapter as a llama.cpp adapter GGUF
   (hot-swapped into a running context).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.models.gguf_vendor import (
    CONVERTER_TIMEOUT_S,
    LAUNCHER,
    OUTTYPES,
    SDIST_ENV,
    GgufError,
    convert_hf_to_gguf,
    default_cache_dir,
    ensure_converter,
    extract_converter,
    is_byte_level_bpe,
    llamacpp_version,
)

# ---- tensor plans -------------------------------------------------------------------------------

def rope_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q/k projection (or its bias, or a LoRA B) from HF's half-split rotary layout to
    GGML's interleaved one: w [out, ...] with out = heads * head_dim -> same shape."""
    out = w.shape[0]
    if heads < 1 or out % (2 * heads):
        raise ValueError(f"{out} rows do not split into {heads} heads of even size")
    return w.reshape(heads, 2, out // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass(frozen=True)
class TensorEntry:
    """One GGUF tensor and the policy parameter it holds."""

    gguf_name: str  # e.g. "blk.0.attn_q.weight"
    hf_name: str  # e.g. "model.layers.0.self_attn.q_proj.weight"
    rope_heads: int  # 0: stored as is; n: rows rope-permuted with n heads


@dataclass(frozen=True)
class TensorPlan:
    arch: str  # general.architecture of the GGUF, e.g. "llama", "qwen2"
    entries: tuple[TensorEntry, ...]

    def by_hf_name(self) -> dict[str, TensorEntry]:
        return {e.hf_name: e for e in self.entries}


def base_param_name(name: str) -> str:
    """A (possibly peft-wrapped) parameter name -> the plain transformers name."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def _as_float(t: Any) -> np.ndarray:
    """A GGUF tensor's values as float32 in torch layout [rows, cols] (dequantized if need be)."""
    from gguf import GGMLQuantizationType, quants

    if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return np.asarray(t.data, dtype=np.float32).reshape(tuple(reversed([int(x) for x in t.shape])))
    return quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(
        tuple(reversed([int(x) for x in t.shape])))


def derive_plan(gguf_path: Path, weights: Mapping[str, Any]) -> TensorPlan:
    """Match every GGUF tensor to the weight it was made from (see the module docstring).

    `weights`: name -> tensor/array of the policy the file was converted from (peft names allowed;
    LoRA parameters are ignored). Raises GgufError when a tensor matches no weight closely enough.
    """
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = str(_field(reader, "general.architecture"))
    blocks = int(_field(reader, f"{arch}.block_count"))
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv") or heads)
    arch_ids = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in arch_ids:
        raise GgufError(f"unknown GGUF architecture {arch!r}")
    names = gguf.get_tensor_name_map(arch_ids[arch], blocks)
    plain = {base_param_name(k): v for k, v in weights.items() if "lora_" not in k}
    by_gguf: dict[str, str] = {}
    for hf_name in plain:
        g = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if g is not None:
            by_gguf.setdefault(g, hf_name)
    entries = []
    for t in reader.tensors:
        hf_name = by_gguf.get(t.name)
        if hf_name is None:
            if t.name == "output.weight" and "model.embed_tokens.weight" in plain:
                hf_name = "model.embed_tokens.weight"  # tied head written out by the converter
            else:
                continue  # derived constants (e.g. rope_freqs) stay as the file has them
        entries.append(TensorEntry(t.name, hf_name, _match_layout(t, _numpy(plain[hf_name]), heads, kv_heads)))
    return TensorPlan(arch, tuple(entries))


def _numpy(w: Any) -> np.ndarray:
    if hasattr(w, "detach"):
        return w.detach().float().cpu().numpy()
    return np.asarray(w, dtype=np.float32)


def _match_layout(t: Any, w: np.ndarray, heads: int, kv_heads: int) -> int:
    """0 when the GGUF tensor is `w` as is, n when it is `w` rope-permuted with n heads."""
    from gguf import GGMLQuantizationType

    stored = _as_float(t)
    if stored.shape != w.shape:
        raise GgufError(f"{t.name}: GGUF shape {stored.shape} != weight shape {w.shape}")
    exact = t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
    scale = float(np.abs(w).max()) or 1.0
    tolerance = (1e-3 if exact else 0.1) * scale  # f16 rounding; a quantization step of a 4-bit block
    errors: dict[int, float] = {}
    for option in sorted({0, heads, kv_heads}):
        try:
            candidate = w if option == 0 else rope_permute(w, option)
        except ValueError:
            continue
        errors[option] = float(np.abs(candidate - stored).max())
    best = min(errors, key=lambda k: errors[k])
    if errors[best] > tolerance:
        raise GgufError(f"{t.name}: no layout of the weights matches the file (error {errors[best]:.3g})")
    return best


def _encode(w: np.ndarray, qtype: Any) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    if qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(w, dtype=np.float32).view(np.uint8).ravel()
    if qtype == GGMLQuantizationType.F16:
        return np.ascontiguousarray(w, dtype=np.float16).view(np.uint8).ravel()
    return np.ascontiguousarray(quants.quantize(w, qtype)).view(np.uint8).ravel()


def refresh_weights(template: Path, plan: TensorPlan, weights: Mapping[str, Any], out: Path) -> Path:
    """Write `out`: `template` with every planned tensor replaced by the new weights (same types)."""
    import gguf

    reader = gguf.GGUFReader(str(template))
    info = {t.name: t for t in reader.tensors}
    plain = {base_param_name(k): v for k, v in weights.items() if "lora_" not in k}
    tmp = out.with_name(out.name + ".part")
    shutil.copyfile(template, tmp)
    try:
        data = np.memmap(tmp, dtype=np.uint8, mode="r+")
        for e in plan.entries:
            t = info[e.gguf_name]
            w = _numpy(plain[e.hf_name])
            if e.rope_heads:
                w = rope_permute(w, e.rope_heads)
            blob = _encode(w, t.tensor_type)
            if blob.size != int(t.n_bytes):
                raise GgufError(f"{e.gguf_name}: {blob.size} bytes for a {int(t.n_bytes)}-byte slot")
            data[int(t.data_offset):int(t.data_offset) + blob.size] = blob
        data.flush()
        del data
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


FLOAT_TYPES = ("f32", "f16", "bf16")  # what dequantized_copy can store


def dequantized_copy(src: Path, out: Path, dtype: str = "f16") -> Path:
    """`src` with every quantized tensor stored as `dtype` (1-D and F32 tensors stay F32), all
    metadata kept.

    For a 4-bit catalog GGUF: the torch policy trains on the dequantized weights, and llama.cpp
    generating from the same values in a float type both matches it far better than 4-bit kernels
    (which also round activations to 8 bits) and, on CPUs, decodes batches faster than the Q4_1
    kernels. f16 holds the Q4_1 grid almost exactly; bf16 is faster still where the CPU has bf16 dot
    products, at a larger rounding (LlamaCppConfig.weights).
    """
    import gguf

    if dtype not in FLOAT_TYPES:
        raise ValueError(f"dtype must be one of {FLOAT_TYPES}, got {dtype!r}")
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "bf16": gguf.LlamaFileType.MOSTLY_BF16}[dtype]
    reader = gguf.GGUFReader(str(src))
    arch = str(_field(reader, "general.architecture"))
    tmp = out.with_name(out.name + ".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)
    writer = gguf.GGUFWriter(str(tmp), arch)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue  # the writer sets these itself
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), vtype, sub_type=sub)
    writer.add_file_type(file_type)
    for t in reader.tensors:
        values = _as_float(t)
        if t.tensor_type == gguf.GGMLQuantizationType.F32 or values.ndim == 1 or dtype == "f32":
            writer.add_tensor(t.name, values)
        elif dtype == "f16":
            writer.add_tensor(t.name, values.astype(np.float16))
        else:
            bf16 = gguf.GGMLQuantizationType.BF16
            writer.add_tensor(t.name, gguf.quants.quantize(values, bf16), raw_dtype=bf16)
    return _write_atomically(writer, tmp, out)


def _write_atomically(writer: Any, tmp: Path, out: Path) -> Path:
    """Write a filled GGUFWriter's file (at `tmp`), then move it into place: readers never see half a file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def lora_pairs(model: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A peft model's LoRA factors by base weight name: {hf weight: (A [r, in], B [out, r])}."""
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, p in model.named_parameters():
        for tag in ("lora_A", "lora_B"):
            marker = f".{tag}."
            if marker in name:
                base = base_param_name(name.split(marker)[0] + ".weight")
                pairs.setdefault(base, {})[tag] = _numpy(p)
    return {k: (v["lora_A"], v["lora_B"]) for k, v in pairs.items() if len(v) == 2}


def write_lora_adapter(plan: TensorPlan, pairs: Mapping[str, tuple[np.ndarray, np.ndarray]], alpha: float,
                       out: Path) -> Path:
    """A llama.cpp LoRA adapter GGUF (f32) for the model the plan describes; llama.cpp scales it by
    alpha / r like peft does."""
    import gguf

    by_hf = plan.by_hf_name()
    tmp = out.with_name(out.name + ".part")
    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)  # it logs every file at INFO
    writer = gguf.GGUFWriter(str(tmp), plan.arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    for hf_name, (a, b) in sorted(pairs.items()):
        entry = by_hf.get(hf_name)
        if entry is None:
            raise GgufError(f"LoRA on {hf_name}, which the GGUF does not hold")
        if entry.rope_heads:
            b = rope_permute(b, entry.rope_heads)  # (P W) = (P B) A: only B's rows move
        writer.add_tensor(entry.gguf_name + ".lora_a", np.ascontiguousarray(a, dtype=np.float32))
        writer.add_tensor(entry.gguf_name + ".lora_b", np.ascontiguousarray(b, dtype=np.float32))
    return _write_atomically(writer, tmp, out)


# The converter half lives in engine.models.gguf_vendor; callers import both halves from here.
__all__ = ["CONVERTER_TIMEOUT_S", "FLOAT_TYPES", "LAUNCHER", "OUTTYPES", "SDIST_ENV", "GgufError", "TensorEntry",
           "TensorPlan", "base_param_name", "convert_hf_to_gguf", "default_cache_dir", "dequantized_copy",
           "derive_plan", "ensure_converter", "extract_converter", "is_byte_level_bpe", "llamacpp_version",
           "lora_pairs", "refresh_weights", "rope_permute", "write_lora_adapter"]


if __name__ == "__main__":  # `python -m engine.models.gguf_convert`: fetch the converter now (make install)
    print(f"llama.cpp converter: {ensure_converter()}")
