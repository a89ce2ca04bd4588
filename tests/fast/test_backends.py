"""Backend choice (doctor's fit, overrides), chat framing, and QLoRA / 8-bit LoRA on this CPU."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import doctor
from engine.models import catalog
from engine.models.backends import (
    HFGenerator,
    TemplatedTokenizer,
    auto_backend,
    backend_of_plan,
    load_for_node,
)
from engine.models.policy import build_byte_tokenizer, build_tiny_policy
from engine.paths import SEED_MODEL_DIR


def test_plan_names_map_to_backends() -> None:
    assert backend_of_plan("llamacpp+transformers", "fp32") == "llamacpp"
    assert backend_of_plan("transformers+bitsandbytes", "nf4") == "bnb-nf4"
    assert backend_of_plan("transformers+bitsandbytes", "int8") == "bnb-int8"
    assert backend_of_plan("transformers", "bf16") == "transformers"


def test_auto_follows_the_fit() -> None:
    gguf = next(s for s in catalog.catalog() if s.id == "smollm2-135m-instruct-q4_1")
    big = catalog.QWEN25_15B
    assert auto_backend(gguf, doctor.hypothetical("cpu", 16)) == "llamacpp"  # CPU: llama.cpp generates
    assert auto_backend(gguf, doctor.hypothetical("mps", 16)) == "llamacpp"
    assert auto_backend(big, doctor.hypothetical("cuda", 24)) == "transformers"  # room for bf16 LoRA
    assert auto_backend(big, doctor.hypothetical("cuda", 6)).startswith("bnb-")  # a 6 GB card needs bitsandbytes


def test_bad_backend_and_gguf_with_bitsandbytes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        load_for_node("seed", "vllm", "cpu", tmp_path)
    with pytest.raises(ValueError, match="GGUF build"):
        load_for_node("smollm2-135m", "bnb-nf4", "cpu", tmp_path)


def test_templated_prompts_keep_their_special_tokens_once() -> None:
    from engine.tasks import preset, regenerate
    from engine.tasks.prompts import PromptBuilder, PromptSpec

    tok = build_byte_tokenizer()
    tok.chat_template = ("{% for m in messages %}<bos>[{{ m['role'] }}:{{ m['content'] }}]{% endfor %}"
                         "{% if add_generation_prompt %}>{% endif %}")
    chat = TemplatedTokenizer(tok)
    question = regenerate(preset("rl").ref("basic_arithmetic", 3, 4))
    text = PromptBuilder(PromptSpec("chat-fewshot", shots=1), chat)(question)
    assert text.startswith("<bos>[system:") and text.endswith(f"[user:{question.text.strip()}]>")
    framed = chat(text)["input_ids"]  # the trainer encodes prompts with special tokens: none are added
    assert framed.count(tok.bos_token_id) == text.count("<bos>") == 4  # system, demo user + assistant, question
    assert framed == tok(text, add_special_tokens=False)["input_ids"]
    assert chat("2", add_special_tokens=False)["input_ids"] == tok("2", add_special_tokens=False)["input_ids"]
    assert chat.eos_token_id == tok.eos_token_id and len(chat) == len(tok)


def qlora_model_dir(tmp_path: Path) -> Path:
    """The seed model when it is built (hidden 256, every Linear a multiple of 32), else a tiny one alike."""
    if (SEED_MODEL_DIR / "config.json").is_file():
        return SEED_MODEL_DIR
    return build_tiny_policy(tmp_path / "tiny32", seed=2, hidden=64, layers=2, heads=2, intermediate=128)


def base_output(model: Any, ids: torch.Tensor) -> torch.Tensor:
    model.eval()  # bitsandbytes' int8 layers compute differently in train mode
    with torch.no_grad(), model.disable_adapter():
        return model(input_ids=ids).logits.float()


def lora_grads(model: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.train()
    model.zero_grad()
    model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backend", ["bnb-nf4", "bnb-int8"])
def test_quantized_lora_round_trains_the_adapter_only(backend: str, tmp_path: Path) -> None:
    import bitsandbytes as bnb

    from engine.sapo.config import preset
    from engine.sapo.trainer import Trainer
    from engine.tasks import library

    warnings.filterwarnings("ignore", module="bitsandbytes")
    loaded = load_for_node(str(qlora_model_dir(tmp_path)), backend, "cpu", tmp_path / "data")
    assert isinstance(loaded.generator, HFGenerator) and "bitsandbytes" in loaded.label
    kind = bnb.nn.Linear4bit if backend == "bnb-nf4" else bnb.nn.Linear8bitLt
    assert sum(isinstance(m, kind) for m in loaded.model.modules()) >= 7
    trainable = {n: p.detach().clone() for n, p in loaded.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    ids = torch.tensor([loaded.tokenizer("12+7=")["input_ids"]])
    before = base_output(loaded.model, ids)
    cfg = preset("cpu-small").replace(num_local=2, completions=4, eval_every=0, checkpoint_every=0, lr=1e-2)
    draw = random.Random(0)
    trainer = Trainer(loaded.model, loaded.tokenizer, cfg, library.preset("rl"), None, None, seed=0,
                      reward_fn=lambda q, c: float(draw.random() < 0.5), generator=loaded.generator)
    result = trainer.run_round()
    assert result.policy_version == 1 and result.metrics["rows_trained"] > 0
    after = dict(loaded.model.named_parameters())
    assert any(not torch.equal(after[n], v) for n, v in trainable.items() if "lora_B" in n)
    assert torch.allclose(base_output(loaded.model, ids), before, atol=1e-4)  # quantized base untouched


def test_qlora_gradients_survive_a_generation_pass(tmp_path: Path) -> None:
    """bitsandbytes repacks 4-bit weights for CPU inference on an eval pass (AVX512-BF16 machines), and
    that layout has no backward: the loader must keep training gradients exact after generating."""
    from engine.models.generate import SampleConfig, generate

    warnings.filterwarnings("ignore", module="bitsandbytes")
    loaded = load_for_node(str(qlora_model_dir(tmp_path)), "bnb-nf4", "cpu", tmp_path / "data")
    model, tok = loaded.model, loaded.tokenizer
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.1)  # non-zero B: every LoRA factor gets a gradient
    ids = torch.tensor([tok("3*4=")["input_ids"]])
    before = lora_grads(model, ids)
    generate(model, tok, ["5+5="], 2, SampleConfig(max_new_tokens=4), seed=0)
    after = lora_grads(model, ids)
    assert before.keys() == after.keys() and len(before) >= 4
    for name, grad in before.items():
        assert torch.allclose(after[name], grad, atol=1e-6, rtol=1e-4), name


def test_training_weights_are_loaded_in_the_planned_dtype_not_the_checkpoints(tmp_path: Path) -> None:
    """A bf16 checkpoint (as Qwen2.5 and SmolLM2 ship) trains from fp32 weights on a CPU."""
    import shutil

    from transformers import AutoModelForCausalLM

    from engine.models.backends import load_for_node
    from engine.models.resolve import train_dtype

    src = build_tiny_policy(tmp_path / "fp32")
    half = tmp_path / "bf16-checkpoint"
    AutoModelForCausalLM.from_pretrained(src, local_files_only=True).to(torch.bfloat16).save_pretrained(half)
    for f in src.iterdir():
        if not (half / f.name).exists():
            shutil.copy(f, half / f.name)
    loaded = load_for_node(str(half), "transformers", "cpu", tmp_path / "data")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    assert train_dtype("cpu", full_finetune=False) == train_dtype("cuda", full_finetune=True) == "float32"
    assert train_dtype("mps", full_finetune=False) == "float16"
