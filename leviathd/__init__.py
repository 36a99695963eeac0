"""leviathd: run AI agents fenced on a shared Linux machine."""

__version__ = "0.1.0"
