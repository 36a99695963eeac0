"""Agents as the daemon runs them (Services): the request off the bus, the
life cycle from start to end, and scopes no record describes."""
