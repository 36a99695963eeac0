"""Pure decisions (Policy): permissions, labels, the taint ledger, the decision
on a tool call (decision.py), allowlists, CEL rules, approvals. No I/O, no daemon."""
