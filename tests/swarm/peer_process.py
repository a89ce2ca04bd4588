"""A swarm peer in its own process for the resilience tests: joins a bootstrap, publishes real groups
every `--every` seconds, and prints one JSON status line per publish (peers seen, groups pooled)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from swarm_helpers import Node, real_groups, swarm_config


async def main(args: argparse.Namespace) -> None:
    node = Node(swarm_config(listen=False, bootstrap_urls=(args.bootstrap,)))
    await node.service.start()
    round_no = 0
    while True:
        round_no += 1
        groups = real_groups(node.identity.peer_id, 1, seed=args.seed * 100_000 + round_no)
        links = await node.service.publish(groups)
        print(json.dumps({"id": node.identity.peer_id, "round": round_no, "links": links,
                          "peers": len(node.service.peers()), "pooled": len(node.pool)}), flush=True)
        await asyncio.sleep(args.every)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=float, default=0.2)
    asyncio.run(main(parser.parse_args()))
