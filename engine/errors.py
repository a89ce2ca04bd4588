"""The project's one exception root.

Everything SAPO raises on purpose derives from `SapoError`, so a caller (the CLI, the control server,
the GUI) can tell "the engine refused this, with a message for a person" from a bug. Each concern keeps
its own subclass, and those that used to be ValueError / RuntimeError still are (callers that catch
those keep working):

    SapoError
    ├── SwarmError (engine/swarm/errors.py): ProtocolError, IdentityError, TransportError, TlsError, ...
    ├── ControlProtocolError, ControlError, TokenError, EngineStartError, ModelSwitchError (engine/control)
    ├── EventError, StoreError, CheckpointError, FleetError, TaskRefError, GgufError, ExportError
"""

from __future__ import annotations


class SapoError(Exception):
    """Base of every error the project raises on purpose."""
