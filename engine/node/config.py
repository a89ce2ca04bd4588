"""One node process's configuration: the model, the trainer's presets, the swarm, the run's limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.machine.memory import MemoryConfig
from engine.models.backends import BACKENDS
from engine.models.llamacpp import LlamaCppConfig
from engine.sapo.config import SapoConfig
from engine.swarm.config import SwarmConfig


@dataclass(frozen=True)
class NodeConfig:
    """One node process."""

    data_dir: Path  # identity, settings, node.db, checkpoints
    model: str = "seed"  # catalog id, or a local model directory
    mix: str = "rl"  # task mix preset (engine.tasks.PRESETS); "rl" excludes gameable specialties
    sapo: SapoConfig = field(default_factory=SapoConfig)  # the trainer (I, J, L, lr, strategy, ...)
    # The trainer for pretrained (non-seed) models, e.g. the cpu-real preset: few-shot chat prompts, the
    # curriculum, the format warm-up. None = `sapo` for every model. A switch of models switches it too.
    real_sapo: SapoConfig | None = None
    swarm: SwarmConfig = field(default_factory=SwarmConfig)  # links, mDNS, bootstrap, pool
    solo: bool = False  # never open swarm links (J is forced to 0)
    rounds: int = 0  # stop (and leave) after this many rounds in this run; 0 = until told to
    seed: int = 0  # RNG seed of this node's question draws and sampling
    device: str | None = None  # "cpu" / "cuda" / "mps"; None = the best available (GPU setting allowing)
    backend: str = "auto"  # engine.models.backends.BACKENDS; "auto" = sapo doctor's fit for this model
    llamacpp: Any = None  # engine.models.llamacpp.LlamaCppConfig for the llama.cpp backend; None = its defaults
    memory: MemoryConfig = field(default_factory=MemoryConfig)  # native heap trims between rounds
    # The held-out judge's seed comes from this node's private key (a space no peer can name or look
    # up); False keeps `sapo.eval_seed`, e.g. to compare nodes on one judge.
    private_judge: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 0:
            raise ValueError("rounds must be an int >= 0")
        if not isinstance(self.private_judge, bool):
            raise TypeError("private_judge must be a bool")
        if self.device not in (None, "cpu", "cuda", "mps"):
            raise ValueError("device must be cpu, cuda or mps")

        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.sapo, SapoConfig) or not isinstance(self.swarm, SwarmConfig):
            raise TypeError("sapo and swarm must be SapoConfig and SwarmConfig")
        if not isinstance(self.memory, MemoryConfig):
            raise TypeError("memory must be a MemoryConfig")
        if self.real_sapo is not None and not isinstance(self.real_sapo, SapoConfig):
            raise TypeError("real_sapo must be a SapoConfig or None")
        if self.llamacpp is not None and not isinstance(self.llamacpp, LlamaCppConfig):
            raise TypeError("llamacpp must be a LlamaCppConfig or None")
