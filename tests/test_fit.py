"""The training fit on hand-built machines: the picks we expect, and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine import doctor
from engine.machine.hardware import GIB
from engine.models import catalog, fit

QWEN05 = catalog.QWEN25_05B


def pick_for(device: str, gb: float, cores: int = 8, can_fetch: bool = True) -> dict:
    return doctor.report(doctor.hypothetical(device, gb, cores), can_fetch=can_fetch)["pick"]


def test_param_counts_match_published_sizes() -> None:
    # published: 0.49B, 1.54B, 0.6B (0.596B), 135M, 362M
    assert abs(catalog.QWEN25_05B.params - 494e6) / 494e6 < 0.01
    assert abs(catalog.QWEN25_15B.params - 1.54e9) / 1.54e9 < 0.01
    assert abs(catalog.QWEN3_06B.params - 596e6) / 596e6 < 0.01
    assert abs(catalog.SMOLLM2_135M.params - 134.5e6) / 134.5e6 < 0.01
    assert abs(catalog.SMOLLM2_360M.params - 362e6) / 362e6 < 0.01


def test_lora_trainable_params_are_a_small_fraction() -> None:
    lora = fit.trainable_params(QWEN05, full=False, rank=16)
    # 24 layers x 16 x (1792 + 1024 + 1024 + 1792 + 5760 + 5760 + 5760)
    assert lora == 24 * 16 * 22912
    assert fit.trainable_params(QWEN05, full=True, rank=16) == QWEN05.params


def test_quantization_shrinks_weights_not_logits() -> None:
    shape = fit.RoundShape()
    bf16 = fit.estimate_bytes(QWEN05, fit.Plan("transformers", "bf16", False), shape, "cuda")
    nf4 = fit.estimate_bytes(QWEN05, fit.Plan("transformers+bitsandbytes", "nf4", False), shape, "cuda")
    assert nf4["weights"] < 0.5 * bf16["weights"]
    assert nf4["logits"] == bf16["logits"] == 4 * 448 * 151936 * 4 * 3


def test_six_gb_laptop_gpu_trains_a_quantized_model() -> None:
    p = pick_for("cuda", 6)
    # bf16 LoRA of a 1.5B model does not fit well in 6 GB; 8-bit does
    assert p["backend"] == "transformers+bitsandbytes"
    assert p["quantization"] in ("int8", "nf4")
    assert p["verdict"] == fit.FITS_WELL
    assert p["estimated_bytes"] <= 0.8 * p["budget_bytes"]


def test_twenty_four_gb_gaming_gpu_trains_the_largest_model_in_bf16() -> None:
    p = pick_for("cuda", 24)
    assert p["model"] == "qwen2.5-1.5b-instruct"
    assert (p["backend"], p["quantization"]) == ("transformers", "bf16")


def test_apple_8gb_gets_the_paper_model_in_fp16_within_metal_budget() -> None:
    rep = doctor.report(doctor.hypothetical("mps", 8), can_fetch=True)
    assert rep["device"]["budget_bytes"] < 8 * GIB  # Metal's working set, not all of RAM
    # the paper's model (its GGUF build generates with llama.cpp on Metal: prompts prefilled once per question)
    assert rep["pick"]["model"].startswith("qwen2.5-0.5b-instruct")
    assert rep["pick"]["quantization"] == "fp16"


def test_apple_16gb_gets_a_larger_model_than_8gb() -> None:
    small, big = pick_for("mps", 8), pick_for("mps", 16)
    sizes = {m.id: m.params for m in catalog.catalog()}
    assert sizes[big["model"]] > sizes[small["model"]]


def test_cpu_laptop_picks_a_gguf_model_with_llamacpp_generation() -> None:
    # sized by the round a CPU node runs (cpu-real: 4 x 8, answer-only completions, shared prompts)
    p = pick_for("cpu", 16, cores=4)
    assert p["model"].endswith("-q4_k_m") and p["backend"] == "llamacpp+transformers"
    assert p["round_seconds"] <= doctor.DEFAULT_MAX_ROUND_SECONDS
    small = pick_for("cpu", 4, cores=2)  # a small laptop: the 135M model
    assert small["model"].startswith("smollm2-135m") and small["round_seconds"] < 60


def test_cpu_round_estimate_matches_measured_rounds() -> None:
    """SmolLM2-135M, 1 thread, cpu-real rounds that train all 32 completions on a 2-core x86 without
    AVX512 (engine/models/fit.py): 2 questions x 16, 18.3 s (generate 5.2 + update 13.1, mean of 5
    rounds); 4 x 8 (the shape before), 24.6 s (generate 6.9 + update 17.7)."""
    from dataclasses import replace

    hw = doctor.hypothetical("cpu", 16, 1)
    spec = catalog.get("smollm2-135m-instruct-q4_1")
    for shape, measured in ((fit.shape_for(spec, hw), 18.3),
                            (replace(fit.CPU_REAL_ROUND, questions=4, completions=8), 24.6)):
        [estimate] = fit.assess(spec, hw, shape, can_fetch=True)
        assert measured * 0.8 <= estimate.round_seconds <= measured * 1.25
    seed = catalog.seed_spec()
    assert seed is not None and fit.shape_for(seed, hw) == fit.CPU_SEED_ROUND
    from engine.sapo.config import preset

    for name, shape in (("cpu-small", fit.CPU_SEED_ROUND), ("cpu-real", fit.CPU_REAL_ROUND)):  # sized as run
        cfg = preset(name)
        assert (shape.questions, shape.completions, shape.max_new_tokens) == \
            (cfg.num_local, cfg.completions, cfg.sampling.max_new_tokens)
    assert fit.shape_for(spec, doctor.hypothetical("cuda", 24)) == fit.RoundShape()


def test_offline_machine_only_picks_models_it_has() -> None:
    rep = doctor.report(doctor.hypothetical("cuda", 24), can_fetch=False)
    chosen = next(c for c in rep["candidates"] if c["model"] == rep["pick"]["model"])
    assert chosen["available"]


def test_nothing_fits_raises_clearly() -> None:
    tiny = doctor.hypothetical("cuda", 0.3)
    with pytest.raises(RuntimeError, match="no model fits"):
        doctor.report(tiny, can_fetch=True, models=[catalog.QWEN25_15B])


def test_doctor_json_shape() -> None:
    out = subprocess.run([sys.executable, "-m", "engine", "doctor", "--json", "--no-probe"], capture_output=True,
                         text=True, check=True, timeout=120)
    data = json.loads(out.stdout)
    assert set(data) >= {"device", "pick", "candidates"}
    assert data["device"]["kind"] in ("cuda", "mps", "cpu")
    assert data["device"]["cpu"]["logical_cores"] >= 1
    assert set(data["pick"]) >= {"model", "backend", "quantization", "estimated_bytes", "budget_bytes",
                                 "verdict", "reason"}
    assert data["pick"]["estimated_bytes"] > 0 and data["pick"]["reason"]
    assert len(data["candidates"]) >= 10
    fast = data["fast_paths"]  # this machine's speed-ups, whatever device is sized
    assert set(fast) == {"llamacpp", "llamacpp_bf16", "torch_cpu_bf16"}
    assert isinstance(fast["llamacpp_bf16"], bool) and isinstance(fast["torch_cpu_bf16"], bool)
    assert fast["llamacpp"] is None or fast["llamacpp"].split()[0] in {"xllamacpp", "llama-cpp-python", "custom"}


def test_doctor_hypothetical_machine_flags() -> None:
    online = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-m", "engine", "doctor", "--json", "--device", "cuda",
                          "--memory-gb", "24"], capture_output=True, text=True, check=True, timeout=120,
                         env=online)
    data = json.loads(out.stdout)
    assert data["device"]["kind"] == "cuda"
    assert data["pick"]["model"] == "qwen2.5-1.5b-instruct"
    offline = subprocess.run([sys.executable, "-m", "engine", "doctor", "--json", "--device", "cuda",
                              "--memory-gb", "24", "--offline"], capture_output=True, text=True, check=True,
                             timeout=120)
    assert json.loads(offline.stdout)["pick"]["model"] == "seed"  # nothing else is on this machine
    bad = subprocess.run([sys.executable, "-m", "engine", "doctor", "--memory-gb", "8"],
                         check=False, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--device" in bad.stderr


def test_availability_says_installed_downloadable_or_why_not(monkeypatch) -> None:
    import socket

    from engine.doctor import HUB_DOWN, HUB_OFF, HUB_UP, availability, hub_status

    seed = catalog.seed_spec()
    remote = next(s for s in catalog.catalog() if s.local_path is None and (s.hf_repo or s.gguf_repo))
    assert availability(seed, HUB_DOWN) == "installed"
    assert availability(remote, HUB_UP) == "downloadable"
    assert availability(remote, HUB_DOWN) == "not installed (no model hub reachable)"
    assert availability(remote, HUB_OFF) == "not installed (downloads are off)"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_status() == HUB_OFF
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with socket.socket() as s:  # a port nobody listens on, on loopback: the hub "does not answer"
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert hub_status(timeout_s=1.0) == HUB_DOWN
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_status(timeout_s=1.0) == HUB_UP
    rep = doctor.report(doctor.hypothetical("cpu", 16), can_fetch=False)
    assert rep["hub"] == HUB_OFF
    assert {c["availability"] for c in rep["candidates"] if c["model"] == "seed"} == {"installed"}
