"""The node: one contributor's engine.

    node         Node: the worker thread that runs rounds, and what the control API drives
    config       NodeConfig: what a node is started with
    swarm        NodeSwarm: its swarm side (the pool, the links, the board)
    peer_groups  the pool's factory and rescorer for peers' rollout groups
    ask          "Try it": a question answered by the policy and the starting model between rounds

`Node` and `NodeConfig` load on first use: both bring torch, and `ask`, which the GUI's control
protocol reads, must stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.node.config import NodeConfig
    from engine.node.node import Node

__all__ = ["Node", "NodeConfig"]


def __getattr__(name: str) -> Any:
    if name == "Node":
        from engine.node.node import Node
        return Node
    if name == "NodeConfig":
        from engine.node.config import NodeConfig
        return NodeConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
