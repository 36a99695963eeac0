"""The audit trail (Services): writing tool decisions to the journal, and the
daemon's journal readers behind `Logs` and `Audit`."""
