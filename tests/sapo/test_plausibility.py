"""The log-prob floor peers' rows are held to: set by this node's own rows, never below the config's."""

from __future__ import annotations

import torch

from engine.sapo.grpo import mean_token_logprob, plausible_completions
from engine.sapo.plausibility import MIN_ROWS, PlausibilityFloor


def test_mean_token_logprob_and_the_floor_on_hand_built_rows() -> None:
    logp = torch.tensor([[-0.5, -1.5, 0.0], [-6.0, -6.0, -6.0], [-0.2, -9.0, -9.0]])  # [B=3, C=3]
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert torch.allclose(mean_token_logprob(logp, mask), torch.tensor([-1.0, -6.0, -0.2]))
    external = torch.tensor([False, True, True])
    assert plausible_completions(logp, mask, external, -8.0).tolist() == [True, True, True]
    assert plausible_completions(logp, mask, external, -2.0).tolist() == [True, False, True]


def test_the_floor_is_the_least_likely_own_rows_less_the_margin() -> None:
    floor = PlausibilityFloor(lowest=-8.0, margin=1.0)
    floor.observe([-0.5] * (MIN_ROWS - 1))
    assert not floor.calibrated() and floor.floor() == -8.0  # too few own rows: the config's floor
    floor.observe([-1.5, float("nan"), 0.5])  # not a log-prob mean: ignored
    assert floor.calibrated() and floor.floor() == -2.5
    floor.observe([-20.0] * 100)  # an own policy that itself writes unlikely text: never below the lowest
    assert floor.floor() == -8.0
    restored = PlausibilityFloor(-8.0, 1.0)
    restored.load_state(floor.state_dict())
    assert restored.floor() == floor.floor()
    restored.load_state({"not": "a list"})
    assert not restored.calibrated()
