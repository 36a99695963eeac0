"""The D-Bus edge (Edge): the interfaces Manager1 and Policy1, polkit, who is
calling (from the bus daemon), bounds on every argument, error names.
The only part of leviathd that knows D-Bus."""
