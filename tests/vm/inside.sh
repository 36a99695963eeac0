#!/bin/bash
# Runs as root inside the Debian 13 VM (tests/vm/), started by
# leviath-vmtest.service from the 9p share /mnt/host; the machine powers off
# when it ends. It only gathers facts: each step writes results/NAME.rc (exit
# status) and results/NAME.out (output), and tests/vm/test_debian13.py on the
# host judges them, one pytest result per check. Steps run in order and later
# ones build on earlier ones, but a failing step never stops the script.
set -u
H=/mnt/host
R=$H/results
mkdir -p "$R"
exec >"$H/inside.log" 2>&1
export LANG=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin
start=$(date +%s)

# What the machine was doing, for a step that did not end in time.
diagnose() {
    {
        echo "== ps"; ps -eo pid,ppid,user,stat,etime,args --forest
        echo "== units"; systemctl list-units --no-pager 'leviath*'
        echo "== journal"; journalctl -b --no-pager -n 150
    } >"$R/diag_$1.out" 2>&1
}
# step NAME CMD...: run CMD (at most STEP_TIMEOUT seconds), record its status
# and output (both streams).
STEP_TIMEOUT=300
step() {
    local name=$1 t0 rc
    shift
    t0=$(date +%s)
    if [ "$(type -t "$1")" = function ]; then  # `as` carries its own timeout
        "$@" >"$R/$name.out" 2>&1 </dev/null
    else
        timeout -k 10 "$STEP_TIMEOUT" "$@" >"$R/$name.out" 2>&1 </dev/null
    fi
    rc=$?
    echo "$rc" >"$R/$name.rc"
    echo "step $name: rc=$rc in $(($(date +%s) - t0))s (at $(($(date +%s) - start))s)"
    [ "$rc" != 124 ] || diagnose "$name"
}
# as USER CMD: a login shell of USER in ~/work (lev refuses the whole home).
as() {
    local user=$1
    shift
    timeout -k 10 "$STEP_TIMEOUT" runuser -l "$user" -c "cd ~/work && $*"
}
ps_json() { as alice "lev ps --all --json"; }
unit_of() {  # unit_of ID: the agent's scope, from lev ps
    echo "unit_of $1" >&2
    ps_json | python3 -c "import json,sys; print(next(r['unit'] for r in json.load(sys.stdin) if r['id']=='$1'))"
}
cgroup_of() { echo "/sys/fs/cgroup$(systemctl show -P ControlGroup "$1")"; }
wait_until() {  # wait_until SECONDS CMD...
    local end=$(($(date +%s) + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 1
    done
}

echo "booted in $(cut -d' ' -f1 /proc/uptime)s of guest uptime" >"$R/boot.out"
step facts sh -c '
    uname -r; systemctl --version | head -n 1
    echo "cgroupfs: $(stat -fc %T /sys/fs/cgroup)"; cat /sys/fs/cgroup/cgroup.controllers
    python3 --version
    dpkg-query -W python3-dbus-fast python3-pydantic python3-pystemd python3-prctl podman crun
    echo "is_system_running: $(systemctl is-system-running)"'

# --- install, as docs/packaging.md says
cp "$H"/leviathd_*.deb /root/
deb=$(ls /root/leviathd_*.deb | head -n 1)
step install apt-get install -y "$deb"
step service_active sh -c 'systemctl is-enabled leviathd && systemctl is-active leviathd'
step files dpkg -L leviathd
step dirs stat -c '%n %a %U:%G' /var/lib/leviath /var/lib/leviath/scratch /var/lib/leviath/agents /etc/leviath
usermod -aG leviath alice
usermod -aG leviath bob
for u in alice bob carol; do runuser -l "$u" -c 'mkdir -p ~/work'; done

# --- the namespace fence (default config), from inside a real agent
cp /mnt/host/escape_probe.py /tmp/probe.py
runuser -l alice -c '
    set -e; h=$HOME; mkdir -p $h/.ssh $h/app
    printf %s "-----BEGIN OPENSSH PRIVATE KEY----- planted" > $h/.ssh/id_ed25519
    chmod 600 $h/.ssh/id_ed25519
    echo "github.com ssh-ed25519 AAAA" > $h/.ssh/known_hosts
    ln -sf $h/.ssh/id_ed25519 $h/app/abs-link
    ln -sf ../.ssh/id_ed25519 $h/app/rel-link
    cp /tmp/probe.py $h/app/probe.py'
runuser -l bob -c 'echo diary > ~/diary'
mkdir -p /opt/suid && cp /usr/bin/id /opt/suid/id && chmod 4755 /opt/suid/id
echo host > /tmp/host-only-marker
python3 -c 'import socket,time; s=socket.create_server(("127.0.0.1", 47011)); s.listen(8); time.sleep(3600)' &
listener=$!
daemon_pid=$(systemctl show -P MainPID leviathd)
cfg="{\"home\": \"/home/alice\", \"workdir\": \"/home/alice/app\", \"other_home\": \"/home/bob\", \"suid_dir\": \"/opt/suid\", \"suid_id\": \"/opt/suid/id\", \"port\": 47011, \"daemon_pid\": $daemon_pid}"
step escape runuser -l alice -c "cd ~/app && GITHUB_TOKEN=ghp_planted AWS_SECRET_ACCESS_KEY=aws_planted lev run -- python3 probe.py '$cfg'"
kill "$listener"

# --- lev run / ps / systemctl / journalctl as a member
step run_id as alice "lev run -- id"
# Long enough to outlive every later step under TCG (the checks took 19
# minutes there once the rootless probe came); `lev stop` ends it before the purge.
step run_detach as alice "lev run --detach -- sleep 7200"
long=$(tail -n 1 "$R/run_detach.out")
step ps as alice "lev ps"
long_unit=$(unit_of "$long")
echo "$long $long_unit" >"$R/long_agent.out"
step status systemctl status --no-pager "$long_unit"
# issue 18: a detached agent keeps one process of ours (a sealed dash as PID 1
# of its namespace), no leviathd process: "pid comm pss_kib" per process.
step agent_procs sh -c "for p in \$(cat $(cgroup_of "$long_unit")/cgroup.procs); do
    echo \$p \$(cat /proc/\$p/comm) \$(awk '/^Pss:/ {print \$2}' /proc/\$p/smaps_rollup)
done"
marker=journal-marker-$RANDOM
step journal_agent as alice "lev run --detach -- sh -c 'echo $marker; sleep 1'"
jid=$(tail -n 1 "$R/journal_agent.out")
junit=$(unit_of "$jid")
# The agent's line waited for, with a bound (a fixed 3 s raced a loaded VM).
wait_until 60 sh -c "journalctl --no-pager -q -o cat -u $junit | grep -q $marker" || true
journalctl --flush 2>/dev/null
echo "$marker" >"$R/journal_marker.out"
step journal_root journalctl --no-pager -o verbose -u "$junit"
step lev_logs as alice "lev logs $jid"
# Issue 14: the agent's output reaches journald through a relay running as
# alice, so it lands in her own journal file (user-1000.journal; persistent
# storage, which Debian 13's systemd sets up on a new install) and she reads
# it with plain journalctl; bob, who is no admin, does not see it.
step journal_as_user as alice "journalctl --no-pager -u $junit"
step journal_other_user as bob "journalctl --no-pager -u $junit"
step journal_storage sh -c '
    systemd-analyze cat-config systemd/journald.conf | grep -i "^#*Storage="
    stat -c "%n %a %U:%G" /var/log/journal; ls /var/log/journal/*/ | grep -c "^user-1000"'

# --- refused by polkit, late (a rule slows its answer): carol, a non-member,
# and alice asking for --no-sandbox (which she may not). polkit is answered
# beside the scope's start (issue 18) for a caller it said yes to before, as
# alice here (her agents above): her scope starts and must be stopped. Nothing
# of either request runs, and no scope, record or process of it stays.
cat >/etc/polkit-1/rules.d/10-leviath-vm-slow.rules <<'EOF9'
polkit.addRule(function (action, subject) {
    var late = (subject.user === "carol" && action.id === "org.leviath.agent.run") ||
               (subject.user === "alice" && action.id === "org.leviath.agent.run-unsandboxed");
    if (!late) { return polkit.Result.NOT_HANDLED; }
    var until = Date.now() + 1500;
    while (Date.now() < until) {}
    return polkit.Result.NO;
});
EOF9
sleep 3  # polkitd reloads its rules on a change of the folder
ls /var/lib/leviath/agents | sort >/tmp/records-before
t0=$(date +%s%N)
step nonmember as carol "lev run -- nice sh -c 'touch /home/carol/work/ran-carol; exec sleep 301'"
echo "took_ms=$((($(date +%s%N) - t0) / 1000000))" >"$R/nonmember_took.out"
t0=$(date +%s%N)
step unsandboxed as alice "lev run --no-sandbox -- nice sh -c 'touch /home/alice/work/ran-alice; exec sleep 301'"
echo "took_ms=$((($(date +%s%N) - t0) / 1000000))" >"$R/unsandboxed_took.out"
sleep 2
step nonmember_left sh -c "
    test -e /home/carol/work/ran-carol && echo ran-carol
    test -e /home/alice/work/ran-alice && echo ran-alice
    pgrep -a -f 'slee[p] 301'
    systemctl list-units --all --plain --no-legend 'leviath-carol-*' 'leviath-*-nice-*'
    ls /var/lib/leviath/agents | sort | diff /tmp/records-before - | sed 's/^/record: /'
    true"
# systemd's word that alice's scope was started before the refusal.
step unsandboxed_scope sh -c "journalctl -b --no-pager -o cat _PID=1 | grep -c 'leviath-alice-nice-'"
rm -f /etc/polkit-1/rules.d/10-leviath-vm-slow.rules

# --- issue 18: an attached one-command agent. The daemon copies its output
# (no supervisor): one process of ours in its scope, PID 1; its output reaches
# the caller and alice's journal; lev exits with its status (128+10 here: the
# command ends by SIGUSR1), through a daemon restart mid-run (the new daemon
# takes the pipes back from PID 1; a flood after it would otherwise block).
# The same agent looks at mounts made on the host beneath /opt (a read-only
# system folder of the fence): the recursive mount_setattr locks them too.
mkdir -p /opt/lvsub/tmp /opt/lvsub/bind /srv/lvsrc && chmod 777 /srv/lvsrc
mount -t tmpfs -o mode=0777 lvtest /opt/lvsub/tmp
mount --bind /srv/lvsrc /opt/lvsub/bind
cat >/home/alice/work/attached.sh <<'EOF8'
for d in tmp bind; do
    touch /opt/lvsub/$d/planted 2>/dev/null && echo wrote-$d
    grep " /opt/lvsub/$d " /proc/self/mountinfo | sed "s/^/mount: /"
done
echo attached-out
echo attached-err >&2
while [ ! -e go ]; do sleep 0.2; done
echo after-restart
head -c 200000 /dev/zero | tr '\0' y | fold -w 500; echo # fold leaves the last line open
echo last-words
sleep 2 # no longer needed: the restarted daemon journals what it reads after PID 1 ends (docs/sandbox.md)
kill -USR1 $$
EOF8
chown alice: /home/alice/work/attached.sh
rm -f /home/alice/work/go
# The poll at an hour: lev hears the end from the restarted daemon (Watch).
runuser -l alice -c 'cd ~/work && exec env LEVIATH_POLL_SECONDS=3600 lev run -- sh attached.sh' \
    >"$R/attached_client.out" 2>"$R/attached_client_err.out" </dev/null &
att_pid=$!
wait_until 120 grep -q attached-out "$R/attached_client.out"
att_id=$(ps_json | python3 -c "import json,sys; print(next(r['id'] for r in json.load(sys.stdin) if r['command']==['sh','attached.sh']))")
att_unit=$(unit_of "$att_id")
echo "$att_id $att_unit" >"$R/attached_agent.out"
sleep 1
# "pid comm pss_kib nspid..." per process of the scope (NSpid: the pid in
# each PID namespace, the agent's last; ours: outside it, or its PID 1).
step attached_procs sh -c "for p in \$(cat $(cgroup_of "$att_unit")/cgroup.procs); do
    echo \$p \$(cat /proc/\$p/comm) \$(awk '/^Pss:/ {print \$2}' /proc/\$p/smaps_rollup) \$(awk '/^NSpid:/ {\$1=\"\"; print}' /proc/\$p/status)
done"
step attached_restart systemctl restart leviathd
wait_until 60 ps_json
runuser -l alice -c 'touch ~/work/go'
wait_until 150 sh -c "! kill -0 $att_pid"
kill "$att_pid" 2>/dev/null
wait "$att_pid"
echo $? >"$R/attached_client.rc"
# The daemon's copy to journald may still drain (under TCG, seconds) after lev
# heard the end: the agent's last line is awaited, at most a minute.
t0=$(date +%s)
wait_until 60 sh -c "journalctl --no-pager -q -o cat -u $att_unit | grep -qx last-words"
echo "journal_wait=$(($(date +%s) - t0))s" >"$R/attached_wait.out"
step attached_journal as alice "journalctl --no-pager -q -o json -u $att_unit"
step attached_ps as alice "lev ps --all --json"
umount /opt/lvsub/tmp /opt/lvsub/bind

# Issue 10 §3: with no config at all the long agent got finite limits, and
# leviath.slice caps all agents together.
step default_limits sh -c "
    echo memtotal=\$(awk '/^MemTotal:/ {print \$2 * 1024}' /proc/meminfo)
    echo pid_max=\$(cat /proc/sys/kernel/pid_max); echo threads_max=\$(cat /proc/sys/kernel/threads-max)
    for p in MemoryMax MemorySwapMax TasksMax CPUWeight; do echo scope_\$p=\$(systemctl show -P \$p $long_unit); done
    cg=\$(systemctl show -P ControlGroup $long_unit)
    for f in memory.max memory.swap.max pids.max cpu.weight; do echo file_\$f=\$(cat /sys/fs/cgroup\$cg/\$f); done
    for p in MemoryMax TasksMax; do echo slice_\$p=\$(systemctl show -P \$p leviath.slice); done
    echo slice_file_memory.max=\$(cat /sys/fs/cgroup/leviath.slice/memory.max)"


# --- limits in cgroup v2 files, fork bomb and memory hog
cat >/etc/leviath/config.toml <<'EOF'
[resources]
memory_max = "64M"
tasks_max = 24
cpu_weight = 50
cpu_quota = "50%"
EOF
systemctl reload leviathd
sleep 2
step limited as alice "lev run --detach -- sleep 900"
lim=$(tail -n 1 "$R/limited.out")
lim_unit=$(unit_of "$lim")
lim_cg=$(cgroup_of "$lim_unit")
step limits sh -c "echo cgroup=$lim_cg; for f in memory.max memory.swap.max pids.max cpu.weight cpu.max; do echo \$f=\$(cat $lim_cg/\$f); done"
as alice "lev stop $lim" >/dev/null 2>&1

# The bomb runs in a subshell beside a first process that needs no fork
# (exec): bash gives up and exits once its forks keep failing, which used to
# end the agent and remove the scope while the test still read its
# pids.events ('No such file or directory', seen in CI from a clean clone).
# Now the scope lives until `lev stop` below, after the last read.
step forkbomb_start as alice "lev run --detach -- bash -c '(while :; do sleep 600 & done) & exec sleep 900'"
fb=$(tail -n 1 "$R/forkbomb_start.out")
fb_cg=/sys/fs/cgroup/leviath.slice/$(sed -n 's/^unit //p' "$R/forkbomb_start.out")
step forkbomb sh -c "
    peak=0; ev=
    for i in \$(seq 40); do
        c=\$(cat $fb_cg/pids.current 2>/dev/null) || break
        [ \$c -gt \$peak ] && peak=\$c
        e=\$(grep max $fb_cg/pids.events) && ev=\$e
        case \$ev in 'max 0'|'') ;; *) [ \$i -ge 4 ] && break ;; esac
        sleep 0.5
    done
    echo peak=\$peak; echo events=\$ev
    systemctl is-active leviathd; echo shell=\$(runuser -l alice -c 'echo alive')"
as alice "lev stop $fb" >/dev/null 2>&1
step memhog as alice "lev run -- python3 -c 'b = bytearray(400 * 2**20); print(\"survived\", len(b))'"
step memhog_after sh -c 'systemctl is-active leviathd; journalctl -k --no-pager | grep -ci "memory cgroup out of memory" || true'
# What ended the hog, for a reader of results/ (the kernel's kill, systemd's OOMPolicy).
step memhog_diag sh -c "systemctl show -P OOMPolicy $long_unit
    journalctl -b --no-pager | grep -i -E 'oom|out of memory|killed process|leviath-alice-python3' | tail -n 40"
rm -f /etc/leviath/config.toml
systemctl reload leviathd

# --- network = "proxy" (issue 12) and a machine rule (issue 15 §1), one config.
# The "outside" server sits on a dummy interface's private address (the proxy
# refuses loopback whatever the config says), allowed by the machine config.
ip link add lvout0 type dummy && ip addr add 10.77.0.2/24 dev lvout0 && ip link set lvout0 up
echo "10.77.0.2 allowed.test" >>/etc/hosts
mkdir -p /srv/www && echo "hello from outside" >/srv/www/hello.txt
python3 -m http.server --bind 10.77.0.2 --directory /srv/www 80 >/dev/null 2>&1 &
webserver=$!
cat >/etc/leviath/config.toml <<'EOF3'
[sandbox]
network = "proxy"

[taint]
allow_private_addresses = true

[proxy]
ports = [80]

[[rules]]
name = "no-pem"
when = 'call.tool == "read_file" && call.target.endsWith(".pem")'
decision = "deny"
reason = "key files stay on the host"
EOF3
systemctl reload leviathd
sleep 2
runuser -l alice -c 'cd ~/work && printf -- "-----BEGIN PRIVATE KEY-----\nVMKEY\n" >server.pem && echo plain-text >small.txt && cat >proxy_probe.py' <<'EOF4'
import json, os, socket, urllib.request
out = {"ifaces": [ln.split(":")[0].strip() for ln in open("/proc/net/dev").readlines()[2:]],
       "http_proxy": os.environ.get("HTTP_PROXY", "")}
try:
    socket.create_connection(("10.77.0.2", 80), timeout=5).close()
    out["direct"] = "ok"
except OSError as e:
    out["direct"] = "err:" + type(e).__name__ + ":" + str(e.errno)
for name in ("allowed.test", "10.77.0.2"):
    try:
        out["proxied_" + name] = urllib.request.urlopen(f"http://{name}/hello.txt", timeout=30).read().decode()
    except Exception as e:
        out["proxied_" + name] = "err:" + repr(e)[:300]
print(json.dumps(out))
EOF4
step proxy as alice "lev run -- python3 proxy_probe.py"
step proxy_ps as alice "lev ps --all"
step rule_pem as alice "lev run -- lev tool read_file server.pem"
step rule_plain as alice "lev run -- lev tool read_file small.txt"
# --- network = true with a git credential (issue 30 item 2): git's per-URL
# proxy names a port on the host's loopback that serves only the agent's own
# processes (the kernel's socket diagnostics, on pure cgroup v2 and git 2.47).
echo "vmgit-5ecret-0d0d0d" >/etc/leviath/vm-git.token && chmod 600 /etc/leviath/vm-git.token
cat >/etc/leviath/config.toml <<'EOF7'
[sandbox]
network = true

[credentials.vmgit]
kind = "git"
hosts = ["allowed.test"]
secret_file = "/etc/leviath/vm-git.token"
EOF7
systemctl reload leviathd
sleep 2
step direct_inside as alice "lev run -- sh -c 'git --version; p=\$(git config --get-urlmatch http.proxy https://allowed.test/repo.git); echo port=\$p; printf \"protocol=https\\nhost=allowed.test\\n\\n\" | git credential fill | grep ^password=; curl -sS --proxy \$p http://allowed.test/hello.txt; echo curl=\$?'"
direct=$(as alice "lev run --detach -- sleep 600")
step direct_bob sh -c "p=\$(sed -n 's/^.*proxy = //p' /run/leviath/agents/$direct/egress.gitconfig | head -1); echo port=\$p; runuser -u bob -- curl -sS --proxy \$p http://allowed.test/hello.txt; echo curl=\$?; curl -sS --proxy \$p http://allowed.test/hello.txt; echo root_curl=\$?"
as alice "lev stop $direct" >/dev/null 2>&1
rm -f /etc/leviath/config.toml /etc/leviath/vm-git.token
systemctl reload leviathd
# --- a cli credential's wrapper where /run is noexec (Debian's initramfs mounts
# it so): `gh` on the sandbox's PATH is the daemon's script in the agent's
# folder on /run; the broker runs the real gh (a stand-in: no GitHub here).
step run_flags findmnt -no OPTIONS /run
cat >/usr/local/bin/gh <<'EOF8'
#!/bin/sh
echo "args: $*"
[ -n "$GH_TOKEN" ] && echo "token: $(printf %s "$GH_TOKEN" | sha256sum | cut -c1-16)"
exit 0
EOF8
chmod 755 /usr/local/bin/gh
printf 'vm-gh-5ecret-4b1d\n' >/etc/leviath/vm-gh.token && chmod 600 /etc/leviath/vm-gh.token
cat >/etc/leviath/config.toml <<'EOF9'
[credentials.gh]
kind = "cli"
command = ["gh"]
token_env = "GH_TOKEN"
secret_file = "/etc/leviath/vm-gh.token"
EOF9
# Waited for, not slept on: the daemon's record of having read the file again.
since=$(date +@%s.%N)
systemctl reload leviathd
for _ in $(seq 600); do
    [ -n "$(journalctl -u leviathd --no-pager -o cat --since "$since" LEVIATH_EVENT=reload)" ] && break
    sleep 0.1
done
step wrapper_noexec as alice "lev run -- sh -c 'command -v gh; gh api user'"
rm -f /etc/leviath/config.toml /etc/leviath/vm-gh.token /usr/local/bin/gh
systemctl reload leviathd

# --- an edit takes effect with no reload (issue 33 item 5): Debian ships no
# inotify-simple, so the daemon watches /etc/leviath and rules.d through libc.
reloads() { journalctl -u leviathd --no-pager -o cat LEVIATH_EVENT=reload | wc -l; }
before=$(reloads)
mkdir -p /etc/leviath/rules.d
cat >/etc/leviath/rules.d/50-vm-watch.toml <<'EOF6'
[[rules]]
name = "vm-watch"
when = 'call.tool == "read_file" && call.target.endsWith("small.txt")'
decision = "deny"
reason = "an edit seen without a reload"
EOF6
step watch_wait sh -c "for i in \$(seq 600); do [ \$(journalctl -u leviathd --no-pager -o cat LEVIATH_EVENT=reload | wc -l) -gt $before ] && exit 0; sleep 0.1; done; exit 1"
step watch_rule as alice "lev run -- lev tool read_file small.txt"
step watch_journal sh -c 'journalctl -u leviathd --no-pager -o cat | grep -a inotify_simple || echo none'
rm -f /etc/leviath/rules.d/50-vm-watch.toml
systemctl reload leviathd
# --- the unit's exposure on Debian 13's systemd (issue 33 item 6)
step analyze systemd-analyze security --no-pager leviathd.service
# --- a blueprint's own tool (issue 15 §2): runs in the agent's fence, its
# arguments substituted into one element each, an option-like value refused.
runuser -l alice -c 'mkdir -p ~/bp && cat >~/bp/blueprint.toml' <<'EOF5'
[agent]
name = "vmtools"
version = "1.0.0"
description = "a blueprint tool on Debian 13"
command = ["sh", "-c", "lev tool showfile --json '{\"path\": \"small.txt\"}'; echo ==; lev tool showfile --json '{\"path\": \"/home/alice/.ssh/id_ed25519\"}'; echo ==; lev tool showfile --json '{\"path\": \"-n\"}'; echo ==; lev tool list"]

[tools.showfile]
description = "print one file"
argv = ["cat", "{path}"]
[tools.showfile.arguments]
required = ["path"]
[tools.showfile.arguments.properties.path]
type = "string"
maxLength = 200
EOF5
step bptool as alice "lev run ~/bp"
wait_until 60 sh -c 'journalctl --no-pager -o verbose -u leviathd | grep -qa "no-pem"' || true
step rule_audit sh -c 'journalctl --no-pager -o verbose -u leviathd | grep -a "no-pem" | head -n 5'
kill "$webserver"
rm -f /etc/leviath/config.toml
systemctl reload leviathd

# --- credentials injected at the egress (issue 30): alice's agent holds a
# placeholder; the proxy puts the secret in only toward api.test, over TLS it
# verifies against the system's CAs (a test CA installed here). The server on
# the dummy address records what each host name received.
mkdir -p /srv/tls && chmod 700 /srv/tls
cat >/srv/tls/make_certs.py <<'EOF8'
import datetime
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

now = datetime.datetime.now(datetime.timezone.utc)
def name(cn): return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
ca = (x509.CertificateBuilder().subject_name(name("leviath vm test CA")).issuer_name(name("leviath vm test CA"))
      .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
      .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
      .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                   data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                   crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
      .add_extension(ski, critical=False)
      .sign(ca_key, hashes.SHA256()))
leaf = (x509.CertificateBuilder().subject_name(name("api.test")).issuer_name(ca.subject)
        .public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in ("api.test", "other.test", "api.anthropic.com")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(ca_key, hashes.SHA256()))
pem = serialization.Encoding.PEM
open("/usr/local/share/ca-certificates/vm-test-ca.crt", "wb").write(ca.public_bytes(pem))
open("/srv/tls/leaf.pem", "wb").write(leaf.public_bytes(pem))
open("/srv/tls/leaf.key", "wb").write(leaf_key.private_bytes(
    pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
EOF8
cat >/srv/tls/server.py <<'EOF8'
import http.server, json, ssl
class Seen(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        seen = {"host": self.headers.get("Host", ""), "auth": self.headers.get("Authorization", "")}
        with open("/srv/tls/seen.jsonl", "a") as f:
            f.write(json.dumps(seen) + "\n")
        body = json.dumps(seen).encode()  # echoed: the proxy must mask the secret on the way back
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
srv = http.server.ThreadingHTTPServer(("10.77.0.2", 443), Seen)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/srv/tls/leaf.pem", "/srv/tls/leaf.key")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
EOF8
step inject_certs sh -c 'python3 /srv/tls/make_certs.py && update-ca-certificates 2>&1 | tail -n 1'
echo "10.77.0.2 api.test other.test api.anthropic.com" >>/etc/hosts
python3 /srv/tls/server.py >/srv/tls/server.log 2>&1 &
tlsserver=$!
printf %s 'vm-inj-5ecret-7f3a9c' >/etc/leviath/vm-api.token
chmod 600 /etc/leviath/vm-api.token
cat >/etc/leviath/config.toml <<'EOF8'
[sandbox]
network = "proxy"

[proxy]
private_ranges = ["10.77.0.0/24"]
ports = [443]

[credentials.api]
kind = "http"
hosts = ["api.test"]
value = "Bearer {secret}"
token_env = "API_TOKEN"
secret_file = "/etc/leviath/vm-api.token"
EOF8
systemctl reload leviathd
sleep 2
runuser -l alice -c 'cd ~/work && cat >inject_probe.py' <<'EOF8'
import json, os, urllib.request
tok = os.environ.get("API_TOKEN", "")
out = {"env_token": tok, "env": dict(os.environ)}
for host in ("api.test", "other.test"):
    req = urllib.request.Request(f"https://{host}/whoami", headers={"Authorization": "Bearer " + tok})
    try:
        out[host] = json.loads(urllib.request.urlopen(req, timeout=60).read().decode())
    except Exception as e:
        out[host] = "err:" + repr(e)[:300]
print(json.dumps(out))
EOF8
step inject as alice "lev run -- python3 inject_probe.py"
step inject_seen cat /srv/tls/seen.jsonl
# Issue 45 on Debian 13: alice's Claude Code login (a stand-in server at
# api.anthropic.com's name, the test CA) stays on the host; the agent holds
# placeholders, and a new login renamed over hers on the host while the agent
# runs (as Claude Code refreshes) shows it nothing real either.
echo '{"claudeAiOauth": {"accessToken": "sk-ant-oat01-VMrealFIRST0Xq7Lm2Vb9Kd4Hs1Wf6Jp3Nc8Rt5", "refreshToken": "sk-ant-ort01-VMrealREFRESH0Zu8Pe1Ox4Mi7Ky2Gl5Db9Sa3", "expiresAt": 4102444800000}}' >/tmp/login1.json
sed 's/VMrealFIRST0Xq7Lm2Vb9Kd4Hs1Wf6Jp3Nc8Rt5/VMrealSECOND0Pk5Jq8Wm1Xn4Bz7Cv2Dh3Lr6/' /tmp/login1.json >/tmp/login2.json
chmod 644 /tmp/login1.json /tmp/login2.json
runuser -l alice -c 'mkdir -p -m 700 ~/.claude/projects && (umask 077 && cat /tmp/login1.json > ~/.claude/.credentials.json) &&
    cd ~/work && rm -f login.phase1 login.renamed login.json && cat > login_probe.py' <<'EOF8'
import json, os, subprocess, time, urllib.request
home = os.path.expanduser("~")
def look():
    text = open(f"{home}/.claude/.credentials.json").read()
    ph = json.loads(text)["claudeAiOauth"]["accessToken"]
    req = urllib.request.Request("https://api.anthropic.com/v1/whoami",
                                 headers={"Authorization": "Bearer " + ph})
    try:
        answer = urllib.request.urlopen(req, timeout=60).read().decode()
    except Exception as e:
        answer = "err:" + repr(e)[:300]
    hits = subprocess.run(["grep", "-r", "-l", "-a", "VMreal", f"{home}/.claude"],
                          capture_output=True, text=True).stdout
    return {"file": text, "placeholder": ph, "answer": answer, "grep": hits}
out = {"before": look()}
open("login.phase1", "w").close()
for _ in range(240):
    if os.path.exists("login.renamed"):
        break
    time.sleep(1)
out["renamed_seen"] = os.path.exists("login.renamed")
out["after"] = look()
with open("projects-write.txt", "w") as f:
    try:
        open(f"{home}/.claude/projects/from-the-agent", "w").write("inside\n")
        f.write("ok")
    except OSError as e:
        f.write(repr(e))
open("login.json", "w").write(json.dumps(out))
EOF8
step login_start as alice "lev run --detach -- python3 login_probe.py"
step login_renamed sh -c '
    for i in $(seq 300); do [ -e /home/alice/work/login.phase1 ] && break; sleep 1; done
    runuser -l alice -c "umask 077 && cat /tmp/login2.json > ~/.claude/.new && mv ~/.claude/.new ~/.claude/.credentials.json && touch ~/work/login.renamed"
    cat /home/alice/.claude/.credentials.json'
wait_until 300 test -e /home/alice/work/login.json || true
step login cat /home/alice/work/login.json
step login_seen sh -c 'grep api.anthropic.com /srv/tls/seen.jsonl; cat /home/alice/.claude/projects/from-the-agent'
rm -f /tmp/login1.json /tmp/login2.json
kill "$tlsserver"
rm -f /etc/leviath/config.toml /etc/leviath/vm-api.token /usr/local/share/ca-certificates/vm-test-ca.crt
# Not --fresh: that rebuilds every hash link and took 4.5 min under TCG;
# plain update-ca-certificates removes the one certificate gone.
update-ca-certificates >/dev/null 2>&1
systemctl reload leviathd

# --- --workdir-mode throwaway (its overlay mount fails in the test bed)
step throwaway as alice "lev run --workdir-mode throwaway -- sh -c 'echo x > throwaway-file && cat throwaway-file'"
step throwaway_after test ! -e /home/alice/work/throwaway-file

# --- the container kind: rootful podman with crun on cgroup v2, the image
# imported from a local tarball (static busybox; the VM has no network)
step container_image sh -c '
    set -e; d=$(mktemp -d /var/tmp/img.XXXXXX); chmod 755 "$d"
    mkdir -p "$d/bin" "$d/etc" "$d/tmp" "$d/proc" "$d/sys" "$d/dev" "$d/root"; chmod 1777 "$d/tmp"
    cp /bin/busybox "$d/bin/busybox"
    for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$d/bin/$a"; done
    echo "root:x:0:0:root:/root:/bin/sh" > "$d/etc/passwd"; echo "root:x:0:" > "$d/etc/group"
    cp /mnt/host/syscall_probe "$d/bin/probe"
    tar -C "$d" -cf "$d.tar" .
    podman import --change "ENV PATH=/bin" "$d.tar" localhost/leviath-vm-busybox:1
    podman info --format "{{.Host.OCIRuntime.Name}} {{.Host.CgroupsVersion}}"'
cat >/etc/leviath/config.toml <<'EOF2'
[sandbox]
kind = "container"
image = "localhost/leviath-vm-busybox:1"

[resources]
memory_max = "64M"
EOF2
systemctl reload leviathd
sleep 2
step container as alice "lev run -- sh -c 'id -u; cat /proc/self/cgroup; test -e /home/bob && echo bob-visible || echo no-bob'"
# Issue 10 §2: the daemon's seccomp profile, applied by podman: the probe (C,
# static, built on the host from tests/syscall_probe.c) tries each call.
step container_seccomp as alice "lev run -- /bin/probe"
# The container's memory is held by the scope's MemoryMax over its cgroup (on
# pure v2 the engine's --memory cannot be set below the scope): dd's 100 MiB
# buffer is killed at 64M.
step container_memhog as alice "lev run -- dd if=/dev/zero of=/dev/null bs=100M count=1"

# --- issue 18's start figures on this machine (reported, not judged: the test
# only asks that every start succeeded). Interleaved rounds of an attached
# `lev run -- true` of a container agent (alice: her config raises the kind),
# of a namespace agent (bob), and `systemd-run --scope true` with the same
# limits (root); each timed inside its own shell, so runuser's start is not in it.
cat >/etc/leviath/config.toml <<'EOF2'
[sandbox]
kind = "namespace"
image = "localhost/leviath-vm-busybox:1"

[resources]
memory_max = "64M"
EOF2
runuser -l alice -c 'mkdir -p ~/.config/leviath && printf "[sandbox]\nkind = \"container\"\n" > ~/.config/leviath/config.toml'
systemctl reload leviathd
sleep 2
# timed WHO: "WHO rc ms" of one start.
timed() {
    local clock='t0=$(date +%s%N); '
    local took='rc=$?; echo "$rc $(( ($(date +%s%N) - t0) / 1000000 ))"'
    if [ "$1" = root ]; then
        sh -c "${clock}systemd-run --scope --quiet -p MemoryMax=64M -p TasksMax=256 true >/dev/null 2>&1; $took"
    else
        runuser -l "$1" -c "cd ~/work && ${clock}lev run -- true >/dev/null 2>&1; $took"
    fi | sed "s/^/$1 /"
}
start_figures() {
    local i
    # One round: the figures under TCG are the emulator's more than ours
    # (the host's bench/ has the real ones); ten took 7.5 min of the VM's
    # budget and three 3.5 min beside the suite.
    timed alice; timed bob; timed root
}
step start_figures start_figures
rm -f /etc/leviath/config.toml /home/alice/.config/leviath/config.toml
systemctl reload leviathd

# --- the filtered engine socket (issue 13) on pure cgroup v2: the agent's
# containers run under its scope, held by its limits, ended by lev stop. The
# client speaks the Docker API with python's http.client (no docker CLI here).
# host_root_engine: these probes test the filter in front of the rootful
# engine (issue 29 made agents' engines rootless by default: the rootless
# probe follows this one).
cat >/etc/leviath/config.toml <<'EOF5'
[sandbox.containers]
enabled = true
host_root_engine = true

[resources]
memory_max = "96M"
tasks_max = 48
EOF5
systemctl reload leviathd
sleep 2
cp /mnt/host/engine_client.py /home/alice/work/engine_client.py
cat >/home/alice/work/engine_probe.sh <<'EOF6'
i='"Image": "localhost/leviath-vm-busybox:1"'
exec python3 engine_client.py \
  "[\"POST\", \"/containers/create?name=vm-e1\", {$i, \"Cmd\": [\"cat\", \"/proc/self/cgroup\"], \"HostConfig\": {\"NetworkMode\": \"none\", \"Memory\": 52428800, \"PidsLimit\": 20}}]" \
  '["POST", "/containers/vm-e1/start", null]' \
  '["POST", "/containers/vm-e1/wait", null]' \
  '["GET", "/containers/vm-e1/logs?stdout=1&stderr=1", null]' \
  "[\"POST\", \"/containers/create?name=vm-hog\", {$i, \"Cmd\": [\"dd\", \"if=/dev/zero\", \"of=/dev/null\", \"bs=200M\", \"count=1\"], \"HostConfig\": {\"NetworkMode\": \"none\"}}]" \
  '["POST", "/containers/vm-hog/start", null]' \
  '["POST", "/containers/vm-hog/wait", null]' \
  "[\"POST\", \"/containers/create\", {$i, \"Cmd\": [\"true\"], \"HostConfig\": {\"Privileged\": true}}]" \
  "[\"POST\", \"/containers/create\", {$i, \"Cmd\": [\"true\"], \"HostConfig\": {\"CgroupParent\": \"/\"}}]"
EOF6
cat >/home/alice/work/engine_long.sh <<'EOF7'
python3 engine_client.py \
  '["POST", "/containers/create?name=vm-long", {"Image": "localhost/leviath-vm-busybox:1", "Cmd": ["sleep", "600"], "HostConfig": {"NetworkMode": "none"}}]' \
  '["POST", "/containers/vm-long/start", null]'
sleep 600
EOF7
chown alice: /home/alice/work/engine_client.py /home/alice/work/engine_probe.sh /home/alice/work/engine_long.sh
step engine_socket as alice "lev run -- sh engine_probe.sh"
step engine_long_start as alice "lev run --detach -- sh engine_long.sh"
el=$(tail -n 1 "$R/engine_long_start.out")
wait_until 90 sh -c 'pid=$(podman inspect -f "{{.State.Pid}}" vm-long) && [ "$pid" != 0 ]'
el_unit=$(unit_of "$el")
step engine_stop sh -c "
    pid=\$(podman inspect -f '{{.State.Pid}}' vm-long); echo pid=\$pid
    echo cgroup=\$(cat /proc/\$pid/cgroup)
    echo unit=$el_unit
    runuser -l alice -c 'cd ~/work && lev stop $el'
    for i in \$(seq 40); do [ -e /proc/\$pid ] || { echo gone; break; }; sleep 1; done
    sleep 3; echo left=\$(podman ps -a -q --filter label=org.leviath.engine-agent | wc -l)
    systemctl is-active leviath-engine-api.service"
rm -f /etc/leviath/config.toml
systemctl reload leviathd

# --- issue 29: with no host_root_engine, the agent's engine is alice's own
# rootless podman (podman 5, crun, pure cgroup v2 here). Her agent starts with
# an empty storage, so it imports a busybox tarball from her workdir through
# $DOCKER_HOST (/images/create?fromSrc=-); the container's facts are read
# from the host while the agent holds it alive, then after lev stop.
step rootless_subids grep -H '^alice:' /etc/subuid /etc/subgid
grep '^root:' /etc/shadow >"$R/rootless_shadow_root.out"
bob_secret="bobs-secret-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
echo "$bob_secret" >"$R/rootless_bob_secret.out"
echo "$bob_secret" >/home/bob/leviath-secret
chown bob: /home/bob/leviath-secret; chmod 600 /home/bob/leviath-secret
# A file every user may read: a container that shows it under /host sees the
# host's / (with alice's rights, past what her agent's fence hides).
host_marker="host-marker-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
echo "$host_marker" >"$R/rootless_host_marker.out"
echo "$host_marker" >/etc/leviath-vm-host-marker; chmod 644 /etc/leviath-vm-host-marker
rm -f /root/leviath-rootless-pwned
cat >/etc/leviath/config.toml <<'EOF8'
[sandbox.containers]
enabled = true
EOF8
systemctl reload leviathd
sleep 2
step rootless_tarball sh -c '
    set -e; d=$(mktemp -d /var/tmp/rl.XXXXXX); chmod 755 "$d"
    mkdir -p "$d/bin" "$d/etc" "$d/tmp" "$d/proc" "$d/sys" "$d/dev" "$d/root"; chmod 1777 "$d/tmp"
    cp /bin/busybox "$d/bin/busybox"
    for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$d/bin/$a"; done
    echo "root:x:0:0:root:/root:/bin/sh" > "$d/etc/passwd"; echo "root:x:0:" > "$d/etc/group"
    tar -C "$d" -cf /home/alice/work/bb.tar .
    rm -rf "$d"
    cp /mnt/host/rootless_client.py /home/alice/work/rootless_client.py
    chown alice: /home/alice/work/bb.tar /home/alice/work/rootless_client.py
    rm -f /home/alice/work/held.json'
rl_import='["IMPORT", "/images/create?fromSrc=-&repo=localhost/leviath-rootless-busybox&tag=latest", "bb.tar"]'
rl_image='"Image": "localhost/leviath-rootless-busybox:latest"'
step rootless_held_start as alice "lev run --detach -- python3 rootless_client.py \
  '[\"OUT\", \"held.json\", null]' '$rl_import' \
  '[\"POST\", \"/containers/create?name=held\", {$rl_image, \"Cmd\": [\"sleep\", \"3171\"], \"HostConfig\": {\"NetworkMode\": \"none\"}}]' \
  '[\"POST\", \"/containers/held/start\", null]' \
  '[\"GET\", \"/containers/held/json\", null]' \
  '[\"SLEEP\", \"600\", null]'"
rl=$(tail -n 1 "$R/rootless_held_start.out")
cat >/root/rootless_held.sh <<'EOF9'
# rootless_held.sh AGENT: the held container's facts on the host ("key=value"
# lines), read while the agent's client sleeps; then lev stop and what is left.
agent=$1 f=/home/alice/work/held.json
for i in $(seq 240); do
    python3 -c 'import json,sys; sys.exit(len(json.load(open(sys.argv[1]))) < 5)' "$f" 2>/dev/null && break
    sleep 1
done
echo "replies=$(cat "$f")"
# The engine numbers pids in its own PID namespace (issue 43): the host's pid
# of the held container is found by its command line, as the bed's test does.
pid=$(pgrep -f '^sleep 3171$' | head -n 1)
echo "pid=$pid"
echo "uid=$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$pid/status")"
echo "cgroup=$(cat "/proc/$pid/cgroup")"
echo "cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline")"
echo "storage=$(stat -c '%u %a' "/var/lib/leviath/engine-storage/$agent")"
echo "unit=$(runuser -l alice -c 'cd ~/work && lev ps --json' | python3 -c "import json,sys; print(next(r['unit'] for r in json.load(sys.stdin) if r['id']=='$agent'))")"
runuser -l alice -c "cd ~/work && lev stop $agent"
for i in $(seq 60); do [ -e "/proc/$pid" ] || { echo gone; break; }; sleep 1; done
for i in $(seq 60); do [ -e "/var/lib/leviath/engine-storage/$agent" ] || { echo storage-gone; break; }; sleep 1; done
[ -e "/run/leviath/engine/$agent.sock" ] && echo socket-left || echo socket-gone
EOF9
step rootless_held sh /root/rootless_held.sh "$rl"
# A container's own view of who it is, then /:/host by a Volumes key and a
# read-only bind of /etc/shadow: refused or run, neither reads root's file or
# bob's, nor writes /root.
rl_script='id -u; cat /host/etc/leviath-vm-host-marker; cat /host/etc/shadow; cat /s; echo planted > /host/root/leviath-rootless-pwned; cat /host/home/bob/leviath-secret; ls /host/root'
step rootless_escape as alice "lev run -- python3 rootless_client.py '$rl_import' \
  '[\"POST\", \"/containers/create?name=facts\", {$rl_image, \"Cmd\": [\"sh\", \"-c\", \"id -u; cat /proc/self/uid_map\"], \"HostConfig\": {\"NetworkMode\": \"none\"}}]' \
  '[\"POST\", \"/containers/facts/start\", null]' \
  '[\"POST\", \"/containers/facts/wait\", null]' \
  '[\"GET\", \"/containers/facts/logs?stdout=1&stderr=1\", null]' \
  '[\"POST\", \"/containers/create?name=vol\", {$rl_image, \"Cmd\": [\"sh\", \"-c\", \"$rl_script\"], \"Volumes\": {\"/:/host\": {}}, \"HostConfig\": {\"NetworkMode\": \"none\"}}]' \
  '[\"POST\", \"/containers/vol/start\", null]' \
  '[\"POST\", \"/containers/vol/wait\", null]' \
  '[\"GET\", \"/containers/vol/logs?stdout=1&stderr=1\", null]' \
  '[\"POST\", \"/containers/create?name=shadow\", {$rl_image, \"Cmd\": [\"sh\", \"-c\", \"$rl_script\"], \"HostConfig\": {\"NetworkMode\": \"none\", \"Binds\": [\"/etc/shadow:/s:ro\"]}}]' \
  '[\"POST\", \"/containers/shadow/start\", null]' \
  '[\"POST\", \"/containers/shadow/wait\", null]' \
  '[\"GET\", \"/containers/shadow/logs?stdout=1&stderr=1\", null]'"
step rootless_pwned sh -c 'test -e /root/leviath-rootless-pwned && echo planted || echo absent'
rm -f /etc/leviath/config.toml /home/bob/leviath-secret /etc/leviath-vm-host-marker
systemctl reload leviathd

# --- issue 49: the Debian docker CLI (docker-cli) on alice's agent's engine
# socket, podman 5 rootless behind it: `docker run` and `docker logs` of a
# detached container with no extra flags (the socket drops unknown
# zero-valued fields and sets the k8s-file log driver). Issue 43 in the same
# agent: a bind of the workdir leaves the fence's read-only .git/config as it
# was, and a build's cache mount climbing out of buildah's cache folder reads
# no marker from alice's ~/.ssh. Issue 46: the metrics file written meanwhile.
mkdir -p /var/lib/prometheus/node-exporter
chmod 755 /var/lib/prometheus /var/lib/prometheus/node-exporter
cat >/etc/leviath/config.toml <<'EOF10'
[sandbox.containers]
enabled = true

[metrics]
interval = 1
EOF10
systemctl reload leviathd
cli_marker="ssh-marker-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
echo "$cli_marker" >"$R/cli_ssh_marker.out"
echo "$cli_marker" >/home/alice/.ssh/vm-cli-marker
chown alice: /home/alice/.ssh/vm-cli-marker; chmod 600 /home/alice/.ssh/vm-cli-marker
runuser -l alice -c 'cd ~/work && git init -q . && mkdir -p ctx' 
sha256sum /home/alice/work/.git/config | cut -d' ' -f1 >"$R/cli_git_config_before.out"
cat >/home/alice/work/ctx/Dockerfile <<'EOF11'
FROM localhost/vm-cli:1
RUN --mount=type=cache,id=../../../../../../../../..,target=/h,uid=0 sh -c 'cat /h/home/alice/.ssh/vm-cli-marker; ls /h/home/alice/.ssh; echo cache-probe-done'
EOF11
cat >/home/alice/work/cli_probe.sh <<'EOF12'
echo "DOCKER_HOST=$DOCKER_HOST"
docker import bb.tar localhost/vm-cli:1 >/dev/null && echo import-ok
docker run localhost/vm-cli:1 echo hi-from-run && echo run-ok
docker run -d --name vm-logs localhost/vm-cli:1 echo hi-from-logs >/dev/null && docker wait vm-logs
docker logs vm-logs && echo logs-ok
docker run --rm -v "$PWD:/w" localhost/vm-cli:1 sh -c \
    'echo "[core] hooksPath = /tmp/evil" >> /w/.git/config && echo container-wrote-config'
DOCKER_BUILDKIT=0 docker build --no-cache ctx && echo build-ok
EOF12
chown -R alice: /home/alice/work/ctx /home/alice/work/cli_probe.sh
step docker_cli as alice "lev run -- sh cli_probe.sh"
sha256sum /home/alice/work/.git/config | cut -d' ' -f1 >"$R/cli_git_config_after.out"
# Issue 49 item 2: podman 5's own `podman --remote` (Debian 13's podman) and
# Debian unstable's docker CLI (copied in by the test) on the same socket.
install -m 0755 /mnt/host/docker-sid /usr/local/bin/docker-sid
cat >/home/alice/work/clients_probe.sh <<'EOF13'
docker import bb.tar localhost/vm-cli:1 >/dev/null && echo import-ok
docker run -d --name v5bg localhost/vm-cli:1 sleep 300 >/dev/null && echo bg-ok
echo "podman-client=$(podman --remote --url "$DOCKER_HOST" version --format '{{.Client.Version}}')"
echo "podman-ps=$(podman --remote --url "$DOCKER_HOST" ps --format '{{.Names}}' | tr '\n' ,)"
echo "podman-images=$(podman --remote --url "$DOCKER_HOST" images --format '{{.Repository}}' | tr '\n' ,)"
podman --remote --url "$DOCKER_HOST" run --rm localhost/vm-cli:1 true; echo "podman-run=$?"
echo "sid-version=$(docker-sid version --format '{{.Client.Version}} {{.Client.APIVersion}}')"
docker-sid run localhost/vm-cli:1 sh -c 'echo hi-from-sid; exit 6'; echo "sid-run=$?"
docker rm -f v5bg >/dev/null && echo cleaned
EOF13
chown alice: /home/alice/work/clients_probe.sh
step clients_v5 as alice "lev run -- sh clients_probe.sh"
# The file is rewritten every second: read once it shows the starts so far.
step metrics_file sh -c '
    f=/var/lib/prometheus/node-exporter/leviathd.prom
    for i in $(seq 30); do
        [ "$(tail -n 1 $f 2>/dev/null)" = "# EOF" ] && grep -q "^leviathd_starts_total" $f && break
        sleep 1
    done
    stat -c "%U:%G %a" $f; cat $f'
# ... and Debian 13's prometheus-node-exporter, running as packaged (its own
# user, the textfile collector on that folder), serves it on :9100.
step metrics_exporter sh -c '
    systemctl start prometheus-node-exporter
    for i in $(seq 60); do
        curl -fsS http://127.0.0.1:9100/metrics >/tmp/node-exporter.txt 2>/dev/null \
            && grep -q "^leviathd_agents_running" /tmp/node-exporter.txt && break
        sleep 1
    done
    grep -E "^(node_textfile_scrape_error|node_textfile_mtime_seconds|leviathd_)" /tmp/node-exporter.txt'
rm -f /etc/leviath/config.toml /home/alice/.ssh/vm-cli-marker
systemctl reload leviathd

# --- issue 46: `lev -H alice@localhost ps` over the VM's sshd (openssh-server)
# to its bus through systemd-stdio-bridge: alice sees her long agent there.
step lev_h sh -c '
    for i in $(seq 60); do systemctl is-active -q ssh && break; sleep 1; done
    runuser -l alice -c "rm -f ~/.ssh/lev_h ~/.ssh/lev_h.pub && ssh-keygen -q -t ed25519 -N \"\" -f ~/.ssh/lev_h \
        && cat ~/.ssh/lev_h.pub >> ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys \
        && printf \"Host localhost\n  IdentityFile ~/.ssh/lev_h\n  StrictHostKeyChecking accept-new\n  BatchMode yes\n\" > ~/.ssh/config"
    as_alice() { timeout -k 10 120 runuser -l alice -c "cd ~/work && $1"; }
    as_alice "lev -H alice@localhost ps --json"'

# --- agents survive a daemon restart
step restart systemctl restart leviathd
sleep 2
step after_restart sh -c "systemctl is-active $long_unit && runuser -l alice -c 'cd ~/work && lev ps --json'"

# --- upgrade to a higher version (if the host built one)
if ls "$H"/upgrade/leviathd_*.deb >/dev/null 2>&1; then
    cp "$H"/upgrade/leviathd_*.deb /root/upgrade.deb
    step upgrade apt-get install -y /root/upgrade.deb
    sleep 2
    step after_upgrade sh -c "dpkg-query -W leviathd; systemctl is-active leviathd && systemctl is-active $long_unit && runuser -l alice -c 'cd ~/work && lev ps --json'"
fi

# --- a lost bus (issue 24 §1): the daemon exits non-zero, systemd starts it
# again, it serves and keeps its agents. Last before the purge: restarting
# dbus disturbs other services too.
step dbus_restart sh -c "
    echo before_pid=\$(systemctl show -P MainPID leviathd) before_restarts=\$(systemctl show -P NRestarts leviathd)
    systemctl restart dbus; sleep 3
    for i in \$(seq 60); do systemctl is-active -q leviathd && runuser -l alice -c 'cd ~/work && lev ps --json' >/tmp/ps.json 2>/dev/null && break; sleep 2; done
    echo after_pid=\$(systemctl show -P MainPID leviathd) after_restarts=\$(systemctl show -P NRestarts leviathd)
    journalctl --no-pager -u leviathd -p err -o cat | grep -c 'lost the system bus connection'
    systemctl is-active $long_unit; cat /tmp/ps.json"

# --- purge leaves nothing behind
as alice "lev stop $long" >/dev/null 2>&1
step purge apt-get purge -y leviathd
step leftovers sh -c '
    for p in /usr/lib/systemd/system/leviathd.service /usr/lib/systemd/system/leviath.slice \
             /lib/systemd/system/leviathd.service /etc/systemd/system/multi-user.target.wants/leviathd.service \
             /usr/share/dbus-1/system.d/org.leviath.Manager1.conf \
             /usr/share/dbus-1/system-services/org.leviath.Manager1.service \
             /usr/share/polkit-1/actions/org.leviath.policy /usr/share/polkit-1/rules.d/50-leviath.rules \
             /usr/lib/sysusers.d/leviathd.conf /usr/lib/tmpfiles.d/leviathd.conf \
             /var/lib/leviath /etc/leviath /usr/bin/lev /usr/bin/leviathd; do
        [ -e "$p" ] && echo "left: $p"
    done
    find /usr /etc /var -xdev -name "*leviath*" ! -name "leviath-vmtest.service" 2>/dev/null | sed "s/^/found: /"
    true'

echo "$(($(date +%s) - start))" >"$R/inside_seconds.out"
echo done >"$R/done.out"
sync
