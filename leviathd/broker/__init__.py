"""The per-agent tool broker.

What the daemon does for each running agent (phase 2 wiring):

    settings = policy_settings(merge_result.agent, machine_config)
    approvals = ApprovalQueue(agent_id=id, owner_uid=user.uid,
                              timeout=settings.approval_timeout,
                              on_request=<emit D-Bus signal>, on_resolved=<journal>)
    broker = Broker(agent_id=id, user=user_info, workdir=workdir, settings=settings,
                    ledger=Ledger(settings.budget), approvals=approvals,
                    audit=<journal writer: record.journal_fields()>,
                    shell=<async ShellRequest -> {"exit_status", "stdout", "stderr"}>)
    broker.start()                         # the opener process, as the agent's user
    server = BrokerServer(broker, lookup=<cgroup path -> agent id or None>)
    await server.start()                   # $LEVIATH_RUNTIME_DIR/agents/<id>/broker.sock
    ...
    broker.reload(new_settings)            # config change: the next call uses it
    approvals.answer(request_id, Answer.ONCE|SESSION|DENY, by_uid,
                     admin=<polkit answer-any>)   # lev approve
    approvals.pending()                    # lev approvals
    await server.close(); broker.close()   # agent ended

Modules: core (Broker, AuditRecord), server (socket, peer identity), tools (file
and credential tools), gitcreds (which git credential covers a URL), net (web
tools), opener (+ opener_worker: opens files as the agent's user), schema
(argument schemas, the gate's view of a call).
"""
