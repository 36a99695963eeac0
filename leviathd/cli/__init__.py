"""`lev` (Face): a client of the bus API and of the agent's tool socket; it
imports no daemon code it does not need to start fast."""
