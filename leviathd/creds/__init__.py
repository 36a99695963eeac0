"""Credentials that never enter the sandbox (issue 15 §3), the daemon's side
(Services): service (what an agent's spec and socket folder get for its
credentials of kind git, cli and ssh), sshagent (the per-agent SSH agent
socket) and knownhosts (which covered host a host key belongs to). The
broker's side of git is broker/gitcreds.py; the programs on the sandbox's
PATH are cli/credhelper.py."""
