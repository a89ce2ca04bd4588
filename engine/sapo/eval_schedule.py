"""When a node's next held-out eval is due: every `eval_every` rounds, and/or after every `eval_every_s`
seconds of training (a real model's rounds vary from 10 s to a minute, so a count of rounds is no clock)."""

from __future__ import annotations

from engine.sapo.config import SapoConfig


def eval_due(cfg: SapoConfig, round_no: int, clock: float) -> bool:
    """After round `round_no`, with `clock` training seconds since the last eval."""
    return bool((cfg.eval_every and round_no % cfg.eval_every == 0)
                or (cfg.eval_every_s and clock >= cfg.eval_every_s))


def eval_due_in(cfg: SapoConfig, round_no: int, clock: float, round_seconds: float) -> float | None:
    """Training seconds from the end of round `round_no` to the next eval (0: now), None when no rule is
    on. The round rule's wait is estimated at `round_seconds` a round."""
    waits = []
    if cfg.eval_every:
        waits.append((-round_no % cfg.eval_every) * round_seconds)
    if cfg.eval_every_s:
        waits.append(max(0.0, cfg.eval_every_s - clock))
    return min(waits) if waits else None
