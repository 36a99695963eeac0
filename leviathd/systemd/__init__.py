"""systemd and journald (Ground): the manager's D-Bus calls, journal records
and streams, cgroup files, and what to do where systemd is not PID 1."""
