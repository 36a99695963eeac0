"""The fence (Fence): the pure sandbox spec (what an agent sees) and the
launchers that build it (none, namespace, container), the held first
process and the seccomp filters."""
