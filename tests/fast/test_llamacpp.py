"""llama.cpp generation for a torch policy: log-probs agree with torch, weights follow updates (full
refresh and LoRA hot-swap), rollouts carry the generating version, and a node trains with it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.models.backends import llamacpp_generator_for
from engine.models.generate import SampleConfig, encode_prompts
from engine.models.gguf_convert import convert_hf_to_gguf, ensure_converter
from engine.models.llamacpp import LlamaCppConfig, LlamaCppGenerator
from engine.models.policy import LoraSpec, load_policy
from engine.sapo.logprobs import build_batch, token_logprobs
from lab.tiny_models import build_tiny_bpe_policy

PROMPTS = ["7+5=", "a longer prompt, so the rows differ in length: 12*3="]
TOL = 2e-3  # f32 weights, f32 KV cache: llama.cpp and torch agree to ~1e-4 per token log-prob


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llamacpp")
    model_dir = build_tiny_bpe_policy(root / "tiny", seed=11, hidden=64, layers=2, heads=4, intermediate=128)
    return {"dir": model_dir, "gguf": convert_hf_to_gguf(model_dir, root / "tiny.gguf", converter=ensure_converter()),
            "root": root}


def make_generator(tiny: dict[str, Path], model: Any, tmp_path: Path, lora: Any = None,
                   sync_every: int = 1, kv_layout: str = "split") -> LlamaCppGenerator:
    cfg = LlamaCppConfig(threads=1, kv_type="f32", sync_every=sync_every, kv_layout=kv_layout)
    return llamacpp_generator_for(model, tiny["gguf"], tmp_path / "work", lora=lora, cfg=cfg)


def max_logprob_gap(model: Any, tok: Any, groups: list[list[Any]]) -> float:
    """max |torch log-prob - generator log-prob| over every sampled token."""
    prompt_rows = encode_prompts(tok, PROMPTS)
    rows_p = [prompt_rows[p] for p, g in enumerate(groups) for _ in g]
    rows_c = [list(c.token_ids) for g in groups for c in g]
    batch = build_batch(rows_p, rows_c, tok.pad_token_id)
    model.eval()
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch, 1.0)
    comps = [c for g in groups for c in g]
    return max(abs(float(logp[r, t]) - lp) for r, c in enumerate(comps) for t, lp in enumerate(c.logprobs))


def test_sampled_logprobs_agree_with_torch(tiny: dict[str, Path], tmp_path: Path) -> None:
    model, tok = load_policy(tiny["dir"])
    gen = make_generator(tiny, model, tmp_path)
    assert gen.sync(model, 0) == 0
    groups = gen.generate(model, tok, PROMPTS, 4, SampleConfig(max_new_tokens=16), seed=5)
    assert [len(g) for g in groups] == [4, 4]
    for c in (c for g in groups for c in g):
        assert len(c.token_ids) == len(c.logprobs) >= 1
        assert c.truncated == (len(c.token_ids) == 16 and c.token_ids[-1] != tok.eos_token_id)
        body = c.token_ids[:-1] if not c.truncated else c.token_ids
        assert c.text == tok.decode(list(body), skip_special_tokens=True)
    assert max_logprob_gap(model, tok, groups) < TOL
    again = gen.generate(model, tok, PROMPTS, 4, SampleConfig(max_new_tokens=16), seed=5)
    other = gen.generate(model, tok, PROMPTS, 4, SampleConfig(max_new_tokens=16), seed=6)
    assert again == groups and other != groups  # seeded, like the torch sampler
    gen.close()


def test_greedy_picks_torchs_argmax(tiny: dict[str, Path], tmp_path: Path) -> None:
    model, tok = load_policy(tiny["dir"])
    gen = make_generator(tiny, model, tmp_path)
    gen.sync(model, 0)
    groups = gen.generate(model, tok, PROMPTS, 1, SampleConfig(temperature=0.0, max_new_tokens=10), seed=0)
    for p, g in enumerate(groups):
        ids = encode_prompts(tok, [PROMPTS[p]])[0] + list(g[0].token_ids)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # [T, V]
        n = len(encode_prompts(tok, [PROMPTS[p]])[0])
        for t, token in enumerate(g[0].token_ids):
            step = logits[n - 1 + t]
            assert float(step.max() - step[token]) < TOL  # llama.cpp's argmax is torch's, up to ties
    gen.close()


def test_full_weights_follow_updates_every_k_versions(tiny: dict[str, Path], tmp_path: Path) -> None:
    model, tok = load_policy(tiny["dir"])
    old, _ = load_policy(tiny["dir"])
    gen = make_generator(tiny, model, tmp_path, sync_every=2)
    cfg = SampleConfig(max_new_tokens=12)
    assert gen.sync(model, 0) == 0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.03)  # "an update" (init std is 0.02)
    assert gen.sync(model, 1) == 0  # not due yet: llama.cpp still samples the version-0 weights
    stale = gen.generate(model, tok, PROMPTS, 3, cfg, seed=1)
    assert max_logprob_gap(old, tok, stale) < TOL
    assert gen.sync(model, 2) == 2
    fresh = gen.generate(model, tok, PROMPTS, 3, cfg, seed=1)
    assert max_logprob_gap(model, tok, fresh) < TOL
    assert max_logprob_gap(old, tok, fresh) > 10 * TOL  # it really is the new weights
    assert gen.syncs == 2
    gen.close()


def test_lora_adapter_is_hot_swapped(tiny: dict[str, Path], tmp_path: Path) -> None:
    lora = LoraSpec(r=4, alpha=8, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"))
    model, tok = load_policy(tiny["dir"], lora=lora)
    base, _ = load_policy(tiny["dir"])
    gen = make_generator(tiny, model, tmp_path, lora=lora)
    assert gen.mode == "lora"
    cfg = SampleConfig(max_new_tokens=12)
    for version in (0, 1):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.3)  # a different adapter each version
        assert gen.sync(model, version) == version
        groups = gen.generate(model, tok, PROMPTS, 3, cfg, seed=version)
        assert max_logprob_gap(model, tok, groups) < TOL
    assert max_logprob_gap(base, tok, groups) > 10 * TOL  # the adapter is live in llama.cpp
    gen.close()


def test_contract_errors_and_growing_batches(tiny: dict[str, Path], tmp_path: Path) -> None:
    model, tok = load_policy(tiny["dir"])
    gen = make_generator(tiny, model, tmp_path)
    with pytest.raises(RuntimeError, match="sync"):
        gen.generate(model, tok, PROMPTS, 2, SampleConfig(max_new_tokens=4))
    gen.sync(model, 0)
    with pytest.raises(ValueError):
        gen.generate(model, tok, PROMPTS, 0, SampleConfig(max_new_tokens=4))
    assert gen.generate(model, tok, [], 2, SampleConfig()) == []
    small = gen.generate(model, tok, PROMPTS[:1], 2, SampleConfig(max_new_tokens=4), seed=0)
    big = gen.generate(model, tok, PROMPTS * 20, 8, SampleConfig(max_new_tokens=6), seed=0)  # 320 rows: 2 calls
    assert len(small) == 1 and len(big) == 40 and all(len(g) == 8 for g in big)
    gen.close()


def test_trainer_stamps_the_generating_version(tiny: dict[str, Path], tmp_path: Path) -> None:
    from engine.sapo.config import preset
    from engine.sapo.trainer import Trainer
    from engine.tasks import library

    model, tok = load_policy(tiny["dir"])
    gen = make_generator(tiny, model, tmp_path, sync_every=2)
    cfg = preset("cpu-small").replace(num_local=2, completions=4, eval_every=0, checkpoint_every=0,
                                      filter_zero_advantage=False)
    flip = iter(range(10**6))
    trainer = Trainer(model, tok, cfg, library.preset("rl"), None, None, seed=1, generator=gen,
                      reward_fn=lambda q, c: float(next(flip) % 2))  # mixed groups: every round updates
    results = [trainer.run_round() for _ in range(3)]
    assert [r.policy_version for r in results] == [1, 2, 3]
    assert [r.local_groups[0].provenance.policy_version for r in results] == [0, 0, 2]
    assert all(r.metrics["loss"] == r.metrics["loss"] for r in results)  # finite, not NaN
    gen.close()


def test_node_trains_with_the_llamacpp_backend(tiny: dict[str, Path], tmp_path: Path) -> None:
    from engine.node import Node, NodeConfig
    from engine.sapo.config import preset

    sapo = preset("cpu-small").replace(num_local=2, completions=4, eval_every=0, checkpoint_every=0)
    node = Node(NodeConfig(data_dir=tmp_path / "data", model=str(tiny["dir"]), sapo=sapo, solo=True, rounds=2,
                           seed=3, backend="llamacpp"))

    async def main() -> None:
        await node.join()
        await asyncio.wait_for(node.finished.wait(), 120)
        await node.leave()

    asyncio.run(main())
    assert node.error is None
    assert node.status().backend.startswith("llama.cpp") and node.status().round == 2
    assert [r["round"] for r in node.history()["rounds"]] == [1, 2]
    assert list((tmp_path / "data" / "models" / "llamacpp").rglob("policy.gguf"))  # llama.cpp's synced copy
    node.store.close()


@pytest.mark.parametrize("layout", ["split", "unified"])
def test_rows_finishing_at_different_times_keep_their_own_cache(tiny: dict[str, Path], tmp_path: Path,
                                                                layout: str) -> None:
    """Split: finished rows free their KV streams and live rows are moved down into them (compaction);
    a moved row must keep attending to its own history. Unified: a prompt's cells are shared by its
    samples, and a finished row's own cells are dropped without touching its siblings'."""
    from engine.models.generate import Completion

    model, tok = load_policy(tiny["dir"])
    gen = make_generator(tiny, model, tmp_path, kv_layout=layout)
    gen.sync(model, 0)
    stop = set(range(3, 3 + 40))  # many stop tokens: rows end at scattered steps
    rows = encode_prompts(tok, PROMPTS)
    sampled = gen.runtime().sample(rows, 8, SampleConfig(max_new_tokens=24), stop, seed=3)
    assert gen.runtime().last_layout == layout
    lengths = {len(t) for t, _, _ in sampled}
    assert len(lengths) >= 4 and any(s for _, _, s in sampled) and not all(s for _, _, s in sampled)
    groups = [[Completion("", tuple(t), tuple(lp), not s) for t, lp, s in sampled[p * 8:(p + 1) * 8]]
              for p in range(len(PROMPTS))]
    assert max_logprob_gap(model, tok, groups) < TOL
    gen.close()


def test_auto_layout_measures_both_then_keeps_the_faster(tiny: dict[str, Path], tmp_path: Path) -> None:
    model, tok = load_policy(tiny["dir"])
    gen = make_generator(tiny, model, tmp_path, kv_layout="auto")
    gen.sync(model, 0)
    runtime = gen.runtime()
    cfg = SampleConfig(max_new_tokens=8)
    used, before = [], {}
    for seed in range(3):
        before = dict(runtime.layout_speed)
        groups = gen.generate(model, tok, PROMPTS, 4, cfg, seed=seed)
        used.append(runtime.last_layout)
        assert max_logprob_gap(model, tok, groups) < TOL  # either layout samples the same policy
    assert used[:2] == ["split", "unified"]  # one call each at this shape (8 rows)...
    assert used[2] == max(("split", "unified"), key=lambda lay: before[(lay, 8)])  # ...then the faster
    runtime.layout_speed[("split", 8)], runtime.layout_speed[("unified", 8)] = 1.0, 2.0
    assert runtime.pick_layout(8) == "unified"
    assert runtime.pick_layout(2) == "split"  # a new shape is measured afresh
    gen.close()


def test_base_weight_types() -> None:
    from engine.models.llamacpp import native_bf16

    assert LlamaCppConfig(weights="f16").base_weights(lora=True) == "f16"
    assert LlamaCppConfig(weights="bf16").base_weights(lora=False) == "bf16"
    assert LlamaCppConfig().base_weights(lora=False) == "f32"  # full fine-tuning: exact copies of torch
    assert LlamaCppConfig(gpu_layers=99).base_weights(lora=True) == "f16"
    assert LlamaCppConfig().base_weights(lora=True) == ("bf16" if native_bf16() else "f16")
