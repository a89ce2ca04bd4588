"""The swarm: how nodes find each other and share rollout groups.

    protocol   sans-I/O frames: sign/verify, limits, replay + rate guards (wire: JSON schemas)
    identity   ed25519 key in the data dir, peer id, adjective-animal name
    pool       bounded, deduplicated pool of peers' groups, re-scored locally
    transport  websockets glue (Link, dial, listen) with clear connection errors
    mdns       LAN discovery (_sapo._tcp.local.)
    service    SwarmService: what the node uses
    bootstrap  BootstrapServer: rendezvous + relay (`sapo bootstrap`)
    errors     the exception tree; config: the dataclasses
"""
