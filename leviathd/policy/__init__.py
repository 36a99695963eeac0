"""Pure decisions (Policy): permissions, labels, the taint ledger, the gate,
allowlists, CEL rules, approvals. No I/O, no daemon."""
