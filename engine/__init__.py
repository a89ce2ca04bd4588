"""SAPO Swarm engine: everything that is not the GUI. Never imports Qt (enforced by a test)."""

__version__ = "0.1.0"
