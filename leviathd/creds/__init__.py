"""Credentials that never enter the sandbox (issue 15 §3), the daemon's side
(Services): service (what an agent's spec and socket folder get for its
credentials of kind git, cli and ssh), sshagent (the per-agent SSH agent
socket), knownhosts (which covered host a host key belongs to), command
(the spec a credential command runs with, for the gate's scope runner) and
fence (the credential fence itself). The pieces that cannot stand here
(the broker's side in broker/credentials.py and broker/gitcreds.py, the
shared CredentialSpec in domain/credentials.py, the programs on the
sandbox's PATH in cli/credhelper.py, the egress injection in proxy/) are
listed in docs/architecture.md "Where credentials live"."""
