"""The policy update on a real tiny Llama: hand-checked loss, clipping only from pass 2, strategies."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from engine.models.generate import SampleConfig, generate
from engine.models.policy import build_tiny_policy, load_policy
from engine.sapo.config import SapoConfig
from engine.sapo.logprobs import build_batch, build_packed_batch, packed_token_logprobs, token_logprobs
from engine.sapo.update import TrainRow, _chunk_rows, make_optimizer, policy_update


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    return load_policy(build_tiny_policy(tmp_path_factory.mktemp("tiny") / "m", seed=4))


def _rows(model: Any, tok: Any, advantages: list[float], external: list[bool] | None = None) -> list[TrainRow]:
    groups = generate(model, tok, ["12+7=", "base 2>10 101\n"], len(advantages) // 2,
                      SampleConfig(max_new_tokens=6), seed=0)
    comps = [(p, c) for p, g in zip(["12+7=", "base 2>10 101\n"], groups) for c in g]
    ext = external or [False] * len(advantages)
    return [TrainRow(tuple(tok(p)["input_ids"]), c.token_ids, a, e, sum(c.logprobs))
            for (p, c), a, e in zip(comps, advantages, ext)]


def _cfg(**kw: Any) -> SapoConfig:
    return SapoConfig(**{"sampling": SampleConfig(max_new_tokens=6), **kw})


def test_first_pass_loss_by_hand(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    model = copy.deepcopy(model)
    rows = _rows(model, tok, [1.0, -1.0, 0.5, -0.5])
    n = [len(r.completion_ids) for r in rows]
    stats = policy_update(model, make_optimizer(model, _cfg()), rows, _cfg(loss_norm="tokens"), tok.pad_token_id)
    # ratio 1 on pass 1: loss = -Σ_i A_i n_i / Σ_i n_i
    expected = -(n[0] - n[1] + 0.5 * n[2] - 0.5 * n[3]) / sum(n)
    assert stats.loss == pytest.approx(expected, abs=1e-6)
    assert stats.tokens == sum(n) and stats.rows == 4 and stats.steps == 1


def test_clipping_acts_only_from_the_second_pass(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    rows = _rows(model, tok, [1.0, -1.0, 1.0, -1.0])
    one = copy.deepcopy(model)
    s1 = policy_update(one, make_optimizer(one, _cfg(lr=0.05)), rows, _cfg(lr=0.05), tok.pad_token_id)
    assert s1.clip_fraction_per_pass == (0.0,)
    two = copy.deepcopy(model)
    s2 = policy_update(two, make_optimizer(two, _cfg(lr=0.05, num_iterations=2)), rows,
                       _cfg(lr=0.05, num_iterations=2), tok.pad_token_id)
    assert s2.clip_fraction_per_pass[0] == 0.0
    assert s2.clip_fraction_per_pass[1] > 0.0
    assert s2.steps == 2


def test_update_moves_log_probs_with_the_advantage_sign(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    model = copy.deepcopy(model)
    rows = _rows(model, tok, [1.0, -1.0, 1.0, -1.0])
    batch = build_batch([r.prompt_ids for r in rows], [r.completion_ids for r in rows], tok.pad_token_id)
    with torch.no_grad():
        before = token_logprobs(model, batch, 1.0)[0].sum(-1)
    policy_update(model, make_optimizer(model, _cfg(lr=1e-2)), rows, _cfg(lr=1e-2), tok.pad_token_id)
    with torch.no_grad():
        after = token_logprobs(model, batch, 1.0)[0].sum(-1)
    delta = (after - before).tolist()
    assert delta[0] > 0 and delta[2] > 0 and delta[1] < 0 and delta[3] < 0


def test_micro_batches_do_not_change_the_step(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    rows = _rows(model, tok, [1.0, -1.0, 0.3, -0.3, 1.0, -1.0])
    results = []
    for mb in (1, 64):
        m = copy.deepcopy(model)
        cfg = _cfg(micro_batch=mb, num_iterations=2)
        # SGD: Adam's first steps are ~lr·sign(g), which turns float noise on tiny gradients into lr.
        policy_update(m, torch.optim.SGD(m.parameters(), lr=0.1), rows, cfg, tok.pad_token_id)
        results.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert torch.allclose(results[0], results[1], atol=1e-6)


def test_positive_only_drops_external_failures(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    rows = _rows(model, tok, [1.0, -1.0, 1.0, -1.0], external=[False, False, True, True])
    m = copy.deepcopy(model)
    cfg = _cfg(external_strategy="positive-only")
    assert policy_update(m, make_optimizer(m, cfg), rows, cfg, tok.pad_token_id).rows == 3
    m = copy.deepcopy(model)
    cfg = _cfg(external_strategy="plain")
    assert policy_update(m, make_optimizer(m, cfg), rows, cfg, tok.pad_token_id).rows == 4


def test_kl_needs_a_reference_and_is_zero_at_the_start(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    rows = _rows(model, tok, [1.0, -1.0, 1.0, -1.0])
    m = copy.deepcopy(model)
    cfg = _cfg(beta=0.1)
    with pytest.raises(ValueError):
        policy_update(m, make_optimizer(m, cfg), rows, cfg, tok.pad_token_id)
    stats = policy_update(m, make_optimizer(m, cfg), rows, cfg, tok.pad_token_id, ref_model=model)
    assert stats.kl == pytest.approx(0.0, abs=1e-6)  # policy == reference before the step


def test_packed_forward_equals_per_row_forward(tiny: tuple[Any, Any]) -> None:
    """Each prompt once, its completions packed behind it under a block mask: same log-probs, same gradient."""
    model, tok = tiny
    model = copy.deepcopy(model)
    rows = _rows(model, tok, [1.0, -1.0, 0.5, -0.5, 1.0, 1.0])
    comps = [list(r.completion_ids) for r in rows]
    comps[0] = comps[0][:1]  # a one-token completion among longer ones
    prompts = [list(r.prompt_ids) for r in rows]
    per_row, ent_a = token_logprobs(model, build_batch(prompts, comps, tok.pad_token_id), 0.7, with_entropy=True)
    packed_batch = build_packed_batch(prompts, comps, tok.pad_token_id)
    assert packed_batch.input_ids.shape[0] == 2  # two distinct prompts for six rows
    shared, ent_b = packed_token_logprobs(model, packed_batch, 0.7, with_entropy=True)
    assert torch.allclose(per_row, shared, atol=1e-5)
    assert ent_a is not None and ent_b is not None and torch.allclose(ent_a, ent_b, atol=1e-4)
    weights = torch.randn(per_row.shape, generator=torch.Generator().manual_seed(0))
    (per_row * weights).sum().backward()
    grads_a = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (shared * weights).sum().backward()
    for a, p in zip(grads_a, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-4)


def test_chunks_pack_whole_prompts_within_budgets(tiny: tuple[Any, Any]) -> None:
    def row(prompt: int, n: int) -> TrainRow:
        return TrainRow((prompt, prompt), tuple(range(n)), 1.0, False)

    rows = [row(1, 5), row(2, 1), row(1, 3), row(3, 8), row(2, 2), row(3, 8), row(1, 1)]
    # packed lengths: prompt 1 -> 2 + 5 + 3 + 1 = 11, prompt 2 -> 2 + 1 + 2 = 5, prompt 3 -> 2 + 16 = 18
    chunks = _chunk_rows(rows, max_rows=64, max_tokens=20)
    assert [[r.prompt_ids[0] for r in c] for c in chunks] == [[1, 1, 1, 2, 2], [3, 3]]  # 11 + 5 <= 20
    split = _chunk_rows(rows, max_rows=2, max_tokens=1000)
    assert all(len(c) <= 2 for c in split)
    assert sorted(id(r) for c in split for r in c) == sorted(map(id, rows))


def test_several_prompts_share_one_packed_sequence(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    rows = _rows(model, tok, [1.0, -1.0, 0.5, -0.5, 1.0, 1.0])
    prompts, comps = [list(r.prompt_ids) for r in rows], [list(r.completion_ids) for r in rows]
    one = build_packed_batch(prompts, comps, tok.pad_token_id, max_len=10_000)
    assert one.input_ids.shape[0] == 1
    distinct = {tuple(p) for p in prompts}
    assert one.input_ids.shape[1] == sum(map(len, comps)) + sum(map(len, distinct))  # no padding at all
    with torch.no_grad():
        per_row = token_logprobs(model, build_batch(prompts, comps, tok.pad_token_id), 1.0)[0]
        packed = packed_token_logprobs(model, one, 1.0)[0]
    assert torch.allclose(per_row, packed, atol=1e-5)


def test_kl_anchor_acts_on_external_rows_only(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    own = _rows(model, tok, [1.0, -1.0, 1.0, -1.0])
    ext = _rows(model, tok, [1.0, -1.0, 1.0, -1.0], external=[True] * 4)
    losses = {}
    for name, rows, anchor in (("own", own, 0.0), ("own+anchor", own, 5.0), ("ext", ext, 0.0),
                               ("ext+anchor", ext, 5.0)):
        m = copy.deepcopy(model)
        cfg = _cfg(lr=0.05, num_iterations=2, external_kl_anchor=anchor, external_strategy="plain")
        losses[name] = policy_update(m, make_optimizer(m, cfg), rows, cfg, tok.pad_token_id,
                                     ref_model=model if anchor else None).loss_per_pass
    assert losses["own"] == pytest.approx(losses["own+anchor"], abs=1e-6)  # no external row: no anchor
    assert losses["ext"][0] == pytest.approx(losses["ext+anchor"][0], abs=1e-6)  # KL is 0 before a step
    assert losses["ext+anchor"][1] > losses["ext"][1] + 1e-4  # after one step the anchor pulls back


def test_autocast_choice_follows_the_model_and_the_cpu(tiny: tuple[Any, Any]) -> None:
    from peft import LoraConfig, get_peft_model

    from engine.machine.hardware import torch_cpu_bf16
    from engine.sapo.update import autocast_dtype

    model, _ = tiny
    assert autocast_dtype("auto", model) is None  # full fine-tuning stays fp32
    assert autocast_dtype("off", model) is None and autocast_dtype("bf16", model) is torch.bfloat16
    lora = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert autocast_dtype("auto", lora) is (torch.bfloat16 if torch_cpu_bf16() else None)
    assert autocast_dtype("auto", lora.to(torch.bfloat16)) is None  # already half precision: as loaded


def test_bf16_autocast_takes_the_same_step_to_bf16_precision(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    rows = _rows(model, tok, [1.0, -1.0, 0.5, -0.5])
    results = []
    for mode in ("off", "bf16"):
        m = copy.deepcopy(model)
        stats = policy_update(m, make_optimizer(m, _cfg(lr=1e-2, autocast=mode)), rows,
                              _cfg(lr=1e-2, autocast=mode, beta=0.04), tok.pad_token_id, ref_model=model)
        results.append((stats, torch.cat([p.detach().flatten() for p in m.parameters()])))
    (fp32, w32), (bf16, w16) = results
    assert bf16.loss == pytest.approx(fp32.loss, rel=0.05, abs=1e-3)
    assert bf16.kl == pytest.approx(0.0, abs=1e-3)  # reference and policy under the same numerics
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    step32, step16 = w32 - start, w16 - start
    assert torch.nn.functional.cosine_similarity(step32, step16, dim=0) > 0.9  # the same direction
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    with pytest.raises(ValueError, match="autocast"):
        SapoConfig(autocast="fp8")


def test_implausible_external_completions_are_left_out() -> None:
    from engine.paths import SEED_MODEL_DIR

    model, tok = load_policy(SEED_MODEL_DIR)  # a trained policy: it has a view of what is plausible
    prompt = tuple(tok("calc 3 + 4\n")["input_ids"])
    own = generate(model, tok, ["calc 3 + 4\n"], 2, SampleConfig(max_new_tokens=12), seed=0)[0]
    peer = tuple(tok("<answer>7</answer>", add_special_tokens=False)["input_ids"]) + (tok.eos_token_id,)
    trigger = tuple(tok("HACKED zq HACKED <answer>7</answer>", add_special_tokens=False)["input_ids"])
    rows = [TrainRow(prompt, own[0].token_ids, 1.0, False), TrainRow(prompt, own[1].token_ids, -1.0, False),
            TrainRow(prompt, peer, 1.0, True), TrainRow(prompt, trigger, 1.0, True)]
    cfg = _cfg(external_strategy="plain", sampling=SampleConfig(max_new_tokens=32))
    m = copy.deepcopy(model)
    stats = policy_update(m, make_optimizer(m, cfg), rows, cfg, tok.pad_token_id)
    assert stats.rows == 4 and stats.implausible == 1  # the trigger; the peer's plain answer stays
    lax = cfg.replace(external_min_logprob=-1e6)
    m = copy.deepcopy(model)
    assert policy_update(m, make_optimizer(m, lax), rows, lax, tok.pad_token_id).implausible == 0
