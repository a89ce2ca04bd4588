"""The trainer a node builds: its settings for this model, the device, the loaded backend.

Out of engine/node/node.py, which composes the pieces; this is the one place that turns a node's
config, the contributor's settings and a model id into a resumed Trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine import tasks
from engine.events import Event, LogRecord, WorkProgress
from engine.machine.load import set_train_threads
from engine.models.backends import load_for_node
from engine.models.catalog import short_name as model_name
from engine.models.resolve import pick_device
from engine.node.config import NodeConfig
from engine.sapo.config import SapoConfig
from engine.sapo.trainer import Trainer
from engine.settings import ContributorSettings
from engine.store import Store
from engine.swarm.identity import Identity


def private_judge_seed(data_dir: Path) -> int:
    """This node's held-out seed, from its private key: below 2^40 (Try it's questions start there)."""
    return Identity.load_or_create(data_dir).private_seed("heldout-judge", bits=40)


@dataclass(frozen=True)
class Built:
    trainer: Trainer
    device: str
    backend: str  # the loaded backend's label
    model_id: str  # the model's id in the store and the checkpoints


def round_config(config: NodeConfig, model: str) -> SapoConfig:
    """The trainer settings for `model`: a real model's own preset, solo's J folded into I, the
    private judge's seed."""
    sapo = config.sapo
    if config.real_sapo is not None and model != "seed":
        sapo = config.real_sapo
    if config.solo and sapo.num_external:
        sapo = sapo.replace(num_local=sapo.num_local + sapo.num_external, num_external=0)
    if config.private_judge:
        sapo = sapo.replace(eval_seed=private_judge_seed(config.data_dir))
    return sapo


def build_trainer(config: NodeConfig, settings: ContributorSettings, model: str, store: Store,
                  checkpoint_dir: Path, publish: Callable[[Event], None], round_now: int) -> Built:
    """Load `model` on the device the settings allow and resume its trainer from `checkpoint_dir`."""
    sapo = round_config(config, model)
    device = pick_device(config.device, settings.use_gpu)
    set_train_threads(device, settings.cpu_cores)
    publish(LogRecord(level="info", message=f"loading {model} on {device} ({config.backend} backend) ..."))
    publish(WorkProgress(phase="loading_model", round=round_now,
                         detail=f"{model_name(model)} (a minute or two on a real model's first start)"))
    import transformers

    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # the GUI and log show our own progress
    loaded = load_for_node(model, config.backend, device, config.data_dir, llamacpp_cfg=config.llamacpp)
    if loaded.prompt_style and loaded.prompt_style != sapo.prompt_style:
        sapo = sapo.replace(prompt_style=loaded.prompt_style)  # e.g. chat models get chat-fewshot prompts
    if loaded.prompt_shots is not None and loaded.prompt_shots != sapo.prompt_shots:
        sapo = sapo.replace(prompt_shots=loaded.prompt_shots)
    trainer = Trainer.resume(loaded.model, loaded.tokenizer, sapo, tasks.preset(config.mix), store,
                             checkpoint_dir, config.seed, model_id=loaded.model_id,
                             on_event=publish, generator=loaded.generator)
    if trainer.discarded_rounds:
        lost = trainer.discarded_rounds
        publish(LogRecord(level="warning", message=(
            f"the last run of {loaded.model_id} ended without a checkpoint after round {trainer.round}: rounds "
            f"{lost[0]}-{lost[-1]} are rolled back from the history; training resumes from round "
            f"{trainer.round}'s weights")))
    return Built(trainer, device, loaded.label, loaded.model_id)


def ready_line(built: Built) -> LogRecord:
    trainer = built.trainer
    return LogRecord(level="info", message=f"ready: {built.model_id} on {built.device}, "
                     f"{'resuming after' if trainer.round else 'starting at'} round {trainer.round}")


__all__ = ["Built", "build_trainer", "private_judge_seed", "ready_line", "round_config"]
