"""Domain types that more than one part of leviathd speaks (the config, the
gate, the broker, the CLI, the bus): each is defined once, here, at the
ground floor, so that Config and Policy can both import it without importing
each other (docs/architecture.md)."""
