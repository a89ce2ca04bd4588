"""llama.cpp's thread count follows the node's choice between rounds, on a live context (no reload)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.machine.load import apply_threads
from engine.models.backends import llamacpp_generator_for
from engine.models.generate import SampleConfig
from engine.models.gguf_convert import convert_hf_to_gguf, ensure_converter
from engine.models.llamacpp import LlamaCppConfig
from engine.models.policy import load_policy
from lab.tiny_models import build_tiny_bpe_policy


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llamacpp-threads")
    model_dir = build_tiny_bpe_policy(root / "tiny", seed=5, hidden=64, layers=2, heads=4, intermediate=128)
    return {"dir": model_dir, "gguf": convert_hf_to_gguf(model_dir, root / "tiny.gguf", converter=ensure_converter())}


def test_set_threads_reaches_the_live_context_and_outranks_the_config(tiny: dict[str, Path], tmp_path: Path) -> None:
    model, tok = load_policy(tiny["dir"])
    gen = llamacpp_generator_for(model, tiny["gguf"], tmp_path / "work", lora=None,
                                 cfg=LlamaCppConfig(threads=1, kv_type="f32"))
    before = torch.get_num_threads()
    try:
        gen.sync(model, 0)
        gen.generate(model, tok, ["1+1="], 2, SampleConfig(max_new_tokens=4), seed=1)
        runtime = gen.runtime()
        assert runtime.lib.llama_n_threads(runtime.ctx) == 1
        apply_threads("cpu", 2, gen)  # what the node does before a round
        assert runtime.threads == 2 and torch.get_num_threads() == 2
        assert runtime.lib.llama_n_threads(runtime.ctx) == runtime.lib.llama_n_threads_batch(runtime.ctx) == 2
        groups = gen.generate(model, tok, ["2+2="], 2, SampleConfig(max_new_tokens=4), seed=2)
        assert len(groups[0]) == 2  # generates on the new count
        gen.close()
        gen.set_threads(1)  # no runtime: kept for the next one
        assert gen.runtime().threads == 1
    finally:
        gen.close()
        torch.set_num_threads(before)
