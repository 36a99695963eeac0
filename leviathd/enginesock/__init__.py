"""The filtered container-engine socket of each agent (`[sandbox.containers]`).

- view.py: which host paths the agent's sandbox shows, for bind mounts;
- rules.py: the Docker Engine API requests an agent may make, and their rewrites;
- wire.py: just enough HTTP/1.1 to read, bound and relay them;
- proxy.py: the per-agent server (asyncio) between the agent and the engine;
- engine.py: the engine's socket (the daemon's own rootful podman API service)
  and the removal of an agent's containers, networks and volumes;
- service.py: the hooks into the agent life cycle.
"""
