"""SapoConfig: everything one node's SAPO trainer needs, typed, documented and validated.

Presets:
  paper      the paper's round shape: 8 questions (I + J = 8; solo I = 8, J = 0), L = 8 completions,
             eps 0.2 / 0.28, beta 0, Adam.
  cpu-small  what suits a CPU laptop: 4 own questions x 8 completions, completions capped at 32 tokens
             (the seed's answers average ~12), a KL anchor to the seed (beta 0.04: in bench/learning.md
             it kept pass@8 and the untrained settings where plain GRPO lost them), a smaller held-out
             eval. About half the compute of `paper` per round; on the seed both run in well under 1 s.
  cpu-real   a real pretrained chat model (SmolLM2-135M) on a CPU: 2 questions x 16 completions of at
             most 24 tokens (answer-only prompts: a solved answer is ~8 tokens). As training sharpens
             the policy, a question's pass rate goes near 0 or 1, and a group of 8 then rarely holds
             both a right and a wrong answer: 16 completions keep ~35% of groups mixed where 4 x 8 fell
             to ~20% (same 32 completions, fewer prompts to prefill). Three solved turns in
             the prompt, the adaptive curriculum (free to go below the entry rung: +0.08 held-out
             pass@1 against the entry rung as a floor), a format reward fading out over 40 rounds, LoRA at
             lr 3e-4, no KL reference (a second 135M forward per round for little: LoRA stays near
             its base). A held-out eval at the start and after every 30 min of training (4 samples of
             16 questions per specialty, ~1.5 min on 2 cores: ~5% of the time; by time, not rounds,
             because a round takes 10-70 s here). bench/real_learning.md measures it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from engine.models.generate import SampleConfig
from engine.sapo.adaptive_j import AdaptiveJConfig
from engine.sapo.checks import check_keys
from engine.sapo.copies import CopiesConfig
from engine.sapo.external import EXTERNAL_STRATEGIES
from engine.sapo.grpo import LOSS_NORMS
from engine.sapo.repeated_text import RepeatedTextConfig
from engine.sapo.reputation import ReputationConfig
from engine.sapo.sampler import SAMPLERS
from engine.tasks.curriculum import CurriculumConfig
from engine.tasks.prompts import MAX_SHOTS, PROMPT_STYLES

AUTOCAST_MODES = ("auto", "off", "bf16")


def _int(name: str, value: Any, low: int, high: int = 2**31 - 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")


def _float(name: str, value: Any, low: float, high: float = math.inf, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or value > high or (low_open and value == low):
        bound = "(" if low_open else "["
        raise ValueError(f"{name} must be a finite number in {bound}{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class SapoConfig:
    """One node's trainer settings. Changing any of them mid-run is a new experiment."""

    num_local: int = 8  # I: own questions generated per round
    num_external: int = 0  # J: external groups drawn per round from the pool (0 = solo)
    # True: peers' groups are trained on (J) only when the peer declares this node's base model. Another
    # model's answers are off this policy: a SmolLM2 node beside seed-model peers ended below solo
    # (bench/real_learning.md). The declaration is the peer's word: a quality filter, not a defence.
    external_same_model: bool = True
    # Of the I own questions, how many may be peers' frontier questions (their groups re-scored here held
    # a right and a wrong answer), answered by this node's own policy: on-policy sharing (sapo/frontier.py)
    num_suggested: int = 0
    suggested_per_origin: int = 1  # suggested questions one peer may place in a round
    # True: num_suggested is the most a round takes, and how many it takes follows what each source has
    # yielded here (mixed groups per CPU-second, sapo/source_choice.py); False: always num_suggested
    adaptive_sources: bool = False
    # Of the I own questions left after suggestions, how many re-ask one of this node's own recent frontier
    # questions (its group here held a right and a wrong answer), each at most twice (sapo/replay.py);
    # measured to lower held-out accuracy: 0 unless reproducing that control
    num_replay: int = 0
    completions: int = 8  # L: completions per question (GRPO group size), >= 2
    lr: float = 1e-4  # Adam learning rate (the pilot: 1e-4 learned, 3e-4 collapsed the seed)
    adam_beta1: float = 0.9  # Adam first-moment decay
    adam_beta2: float = 0.999  # Adam second-moment decay
    weight_decay: float = 0.0  # decoupled weight decay (AdamW); 0 = plain Adam as in the paper
    max_grad_norm: float = 1.0  # global gradient-norm clip; 0 disables it
    eps_low: float = 0.2  # lower clip range of the ratio (1 - eps_low)
    eps_high: float = 0.28  # upper clip range of the ratio (1 + eps_high), asymmetric as in DAPO
    beta: float = 0.0  # weight of KL(policy || frozen reference) on every trained token (k3 estimator)
    num_iterations: int = 1  # passes (optimizer steps) over a round's batch; clipping acts only from pass 2
    loss_norm: str = "nonzero_tokens"  # denominator of the summed token loss: see grpo.loss_denominator
    filter_zero_advantage: bool = True  # drop groups whose rewards are all equal before sampling
    advantage_eps: float = 1e-6  # eps in (r - mean) / (std + eps)
    external_strategy: str = "positive-only"  # plain | positive-only | importance-weighted
    importance_max_weight: float = 1.0  # truncation of the receiver/generator sequence ratio
    external_kl_anchor: float = 0.0  # weight of KL to the seed policy on external completions' tokens
    # Plausibility (the homogeneous defence of arXiv 2511.09780): an external completion whose mean
    # per-token log-prob under this node's own policy is below this is left out of the loss. The
    # log-probs are computed for the loss anyway: no extra forward. This is the lowest floor (and the
    # floor until calibrated); the round's floor is the least likely 1% of this node's own trained
    # completions less `external_logprob_margin` nats/token (engine/sapo/plausibility.py).
    external_min_logprob: float = -8.0
    external_logprob_margin: float = 1.0
    sampler: str = "uniform"  # how the J external groups are drawn: uniform | reputation (by origin's record)
    reputation: ReputationConfig = field(default_factory=ReputationConfig)  # each origin's record here
    # J chosen each round by a bandit on the node's own reward gains (<= num_external); off = num_external
    adaptive_j: AdaptiveJConfig = field(default_factory=AdaptiveJConfig)
    # At most ceil(J x this) of a round's external groups from one origin peer. 1 = the paper's uniform
    # draw; the node presets (cpu-small, cpu-real) cap one peer at half of J.
    max_origin_share: float = 1.0
    repeated_text: RepeatedTextConfig = field(default_factory=RepeatedTextConfig)  # peers' unexplained repeats
    copies: CopiesConfig = field(default_factory=CopiesConfig)  # copies in a peer's group, bound by own groups'
    # A new origin's groups are shown but not trained on until it has been a candidate here for this
    # many rounds (engine/sapo/quarantine.py); 0 = trained from its first round.
    quarantine_rounds: int = 3
    sampling: SampleConfig = field(default_factory=SampleConfig)  # generation for training rounds
    partial_credit: bool = False  # verifier partial credit (False: reward 1 only for a right answer)
    prompt_style: str = "compact"  # task prompt template: engine.tasks.prompts.PROMPT_STYLES
    prompt_shots: int = 1  # solved demonstrations in few-shot prompts (chat-fewshot, fewshot)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)  # per-specialty difficulty rungs
    # Format warm-up: weight of a well-formed-answer bonus added to the training reward, falling linearly
    # to 0 over format_reward_rounds. Stored apart from correctness, never in held-out numbers. 0 = off.
    format_reward: float = 0.0
    format_reward_rounds: int = 0  # rounds over which the format bonus fades out
    dataset_seed: int = 1000  # ReasoningGym dataset seed training questions are drawn from
    micro_batch: int = 64  # max completions per forward/backward chunk (memory bound; not the step size)
    micro_batch_tokens: int = 2048  # max packed positions (prompts + completions) per forward/backward chunk
    pack_len: int = 256  # max positions of one packed sequence (attention cost grows with its square)
    # Mixed precision of the update's forward/backward: "auto" = bf16 autocast when LoRA adapters train
    # on full-precision CPU weights and the CPU has native bf16 (AVX512-BF16 / AMX): ~2.4x faster updates
    # on SmolLM2-135M here; full fine-tuning, GPUs and other CPUs stay as loaded. "off" or "bf16" force it.
    autocast: str = "auto"
    # What a crash (kill -9, power cut) may cost. A checkpoint is written on a clean stop and after the
    # round that reaches any of these; a kill loses at most checkpoint_seconds of finished rounds plus
    # the round in flight.
    checkpoint_seconds: float = 30.0  # finished work a crash may lose at most; 0 = no time rule
    # ... and after every round whose work since the last write is at least 1/overhead times what that
    # write cost (a LoRA adapter and its Adam state write in milliseconds: every round); 0 = off
    checkpoint_overhead: float = 0.02
    checkpoint_every: int = 0  # ... and every N rounds; 0 = no round rule
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    eval_every: int = 100  # rounds between held-out evaluations; 0 = no round rule
    # ... and after every this many seconds of training (the rounds' own time, not evals' or pauses'), the
    # rule for real models, whose rounds vary from 10 s to a minute; 0 = no time rule. With either rule on,
    # a model's first round here starts with a baseline eval (round 0): where it started.
    eval_every_s: float = 0.0
    eval_per_specialty: int = 32  # held-out questions per specialty
    eval_k: int = 8  # samples per held-out question (pass@k)
    eval_seed: int = 424242  # held-out question set and its sampling seed (fixed across runs)

    def __post_init__(self) -> None:
        self._check_round_shape()
        self._check_optimizer()
        self._check_external()
        self._check_prompts_and_rewards()
        self._check_schedule()

    def _check_round_shape(self) -> None:
        _int("num_local", self.num_local, 0, 256)
        _int("num_external", self.num_external, 0, 256)
        if self.num_local + self.num_external < 1:
            raise ValueError("num_local + num_external must be >= 1")
        _int("num_suggested", self.num_suggested, 0, self.num_local)
        _int("suggested_per_origin", self.suggested_per_origin, 1, 256)
        _int("num_replay", self.num_replay, 0, self.num_local)
        if not isinstance(self.adaptive_sources, bool):
            raise ValueError("adaptive_sources must be true or false")  # noqa: TRY004 (ValueError for every bad input)
        _int("completions", self.completions, 2, 64)

    def _check_optimizer(self) -> None:
        """Adam, the clipped objective and its normalisation."""
        _float("lr", self.lr, 0.0, 1.0, low_open=True)
        _float("adam_beta1", self.adam_beta1, 0.0, 0.999999)
        _float("adam_beta2", self.adam_beta2, 0.0, 0.999999)
        _float("weight_decay", self.weight_decay, 0.0, 1.0)
        _float("max_grad_norm", self.max_grad_norm, 0.0)
        _float("eps_low", self.eps_low, 0.0, 1.0)
        _float("eps_high", self.eps_high, 0.0)
        _float("beta", self.beta, 0.0)
        _int("num_iterations", self.num_iterations, 1, 64)
        if self.loss_norm not in LOSS_NORMS:
            raise ValueError(f"loss_norm must be one of {LOSS_NORMS}, got {self.loss_norm!r}")
        _float("advantage_eps", self.advantage_eps, 0.0, 1.0, low_open=True)

    def _check_external(self) -> None:
        if self.external_strategy not in EXTERNAL_STRATEGIES:
            raise ValueError(f"external_strategy must be one of {EXTERNAL_STRATEGIES}, "
                             f"got {self.external_strategy!r}")
        _float("importance_max_weight", self.importance_max_weight, 0.0, 1e6, low_open=True)
        _float("external_kl_anchor", self.external_kl_anchor, 0.0)
        _float("external_min_logprob", self.external_min_logprob, -1e6, 0.0)
        _float("external_logprob_margin", self.external_logprob_margin, 0.0, 1e6)
        _float("max_origin_share", self.max_origin_share, 0.0, 1.0, low_open=True)
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {sorted(SAMPLERS)}, got {self.sampler!r}")
        if not isinstance(self.external_same_model, bool):
            raise ValueError("external_same_model must be true or false")  # noqa: TRY004 (ValueError for every bad input)

    def _check_prompts_and_rewards(self) -> None:
        """Sampling, prompts, rewards and the nested configs."""
        if not isinstance(self.sampling, SampleConfig):
            raise ValueError("sampling must be a SampleConfig")  # noqa: TRY004 (ValueError for every bad input)
        if not isinstance(self.partial_credit, bool) or not isinstance(self.filter_zero_advantage, bool):
            raise ValueError("partial_credit and filter_zero_advantage must be booleans")  # noqa: TRY004 (ValueError for every bad input)
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {self.prompt_style!r}")
        _int("prompt_shots", self.prompt_shots, 0, MAX_SHOTS)
        if not isinstance(self.curriculum, CurriculumConfig):
            raise ValueError("curriculum must be a CurriculumConfig")  # noqa: TRY004 (ValueError for every bad input)
        if not isinstance(self.reputation, ReputationConfig):
            raise ValueError("reputation must be a ReputationConfig")  # noqa: TRY004 (ValueError for every bad input)
        if not isinstance(self.repeated_text, RepeatedTextConfig):
            raise ValueError("repeated_text must be a RepeatedTextConfig")  # noqa: TRY004 (ValueError for every bad input)
        if not isinstance(self.copies, CopiesConfig):
            raise ValueError("copies must be a CopiesConfig")  # noqa: TRY004 (ValueError for every bad input)
        if not isinstance(self.adaptive_j, AdaptiveJConfig):
            raise ValueError("adaptive_j must be an AdaptiveJConfig")  # noqa: TRY004 (ValueError for every bad input)
        _float("format_reward", self.format_reward, 0.0, 1.0)
        _int("format_reward_rounds", self.format_reward_rounds, 0)
        _int("quarantine_rounds", self.quarantine_rounds, 0, 10000)
        _int("dataset_seed", self.dataset_seed, 0, 2**62)

    def _check_schedule(self) -> None:
        """Update chunking, precision, checkpoints and held-out evals."""
        _int("micro_batch", self.micro_batch, 1, 4096)
        _int("micro_batch_tokens", self.micro_batch_tokens, 1, 2**24)
        _int("pack_len", self.pack_len, 1, 2**20)
        if self.autocast not in AUTOCAST_MODES:
            raise ValueError(f"autocast must be one of {AUTOCAST_MODES}, got {self.autocast!r}")
        _float("checkpoint_seconds", self.checkpoint_seconds, 0.0, 86400.0)
        _float("checkpoint_overhead", self.checkpoint_overhead, 0.0, 1.0)
        _int("checkpoint_every", self.checkpoint_every, 0)
        _int("keep_checkpoints", self.keep_checkpoints, 1, 1000)
        _int("eval_every", self.eval_every, 0)
        _float("eval_every_s", self.eval_every_s, 0.0, 30 * 86400.0)
        _int("eval_per_specialty", self.eval_per_specialty, 1, 10000)
        _int("eval_k", self.eval_k, 1, 64)
        _int("eval_seed", self.eval_seed, 0, 2**62)
        if self.eval_seed == self.dataset_seed:
            raise ValueError("eval_seed must differ from dataset_seed (held-out questions must not be trained on)")

    @property
    def questions_per_round(self) -> int:
        return self.num_local + self.num_external

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> SapoConfig:
        """Validate a stored/user config (unknown keys are an error, not silently ignored)."""
        check_keys(cls, data, "sapo config")
        values = dict(data)
        for key, nested in (("sampling", SampleConfig), ("curriculum", CurriculumConfig),
                            ("repeated_text", RepeatedTextConfig), ("copies", CopiesConfig),
                            ("reputation", ReputationConfig), ("adaptive_j", AdaptiveJConfig)):
            if isinstance(values.get(key), dict):  # a stored config holds nested dataclasses as objects
                check_keys(nested, values[key], key)
                values[key] = nested(**values[key])
        return cls(**values)

    def replace(self, **changes: Any) -> SapoConfig:
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, SapoConfig] = {
    "paper": SapoConfig(),
    "cpu-small": SapoConfig(num_local=4, completions=8, sampling=SampleConfig(max_new_tokens=32), beta=0.04,
                            eval_per_specialty=16, eval_every=200, max_origin_share=0.5),
    "cpu-real": SapoConfig(num_local=2, completions=16, lr=3e-4, sampling=SampleConfig(max_new_tokens=24),
                           prompt_style="chat-fewshot", prompt_shots=3, curriculum=CurriculumConfig(enabled=True),
                           format_reward=0.5, format_reward_rounds=40, eval_per_specialty=16, eval_every=0,
                           eval_every_s=1800.0, eval_k=4, max_origin_share=0.5),
}


def preset(name: str) -> SapoConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown sapo preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]
