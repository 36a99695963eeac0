"""Run inside a fenced agent (with the system python) by the escape tests, on
the host (tests/root/) and through the real daemon in the test bed
(tests/integration/): tries each way out and prints one JSON object saying
what worked. Its one argument is a JSON object: home, workdir, other_home,
suid_dir, suid_id, port, and optionally daemon_pid."""

import ctypes
import errno
import json
import os
import platform
import socket
import subprocess
import sys

cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
out = {}

def attempt(fn):
    try:
        r = fn()
        return "ok" if r is None else "ok:" + str(r)
    except OSError as e:
        return "err:" + errno.errorcode.get(e.errno, str(e.errno))

def read(p):
    with open(p) as f:
        return f.read()

def write(p):
    with open(p, "w") as f:
        f.write("x")

def call(rc):
    if rc != 0:
        raise OSError(ctypes.get_errno(), "")

key = cfg["home"] + "/.ssh/id_ed25519"
out["key_by_path"] = attempt(lambda: read(key))
out["key_via_abs_link"] = attempt(lambda: read(cfg["workdir"] + "/abs-link"))
out["key_via_rel_link"] = attempt(lambda: read(cfg["workdir"] + "/rel-link"))
out["key_via_proc1_root"] = attempt(lambda: read("/proc/1/root" + key))
out["key_via_proc_self_root"] = attempt(lambda: read("/proc/self/root" + key))
if "daemon_pid" in cfg:
    out["key_via_daemon_root"] = attempt(lambda: read(f"/proc/{cfg['daemon_pid']}/root" + key))
out["ssh_dir"] = attempt(lambda: sorted(os.listdir(cfg["home"] + "/.ssh")))
out["known_hosts"] = attempt(lambda: read(cfg["home"] + "/.ssh/known_hosts"))
out["gitconfig"] = attempt(lambda: read(cfg["home"] + "/.gitconfig"))
out["other_home"] = attempt(lambda: os.listdir(cfg["other_home"]))
out["home_listing"] = attempt(lambda: sorted(os.listdir(cfg["home"])))
out["tmp_listing"] = attempt(lambda: sorted(os.listdir("/tmp")))
out["write_tmp"] = attempt(lambda: write("/tmp/agent-was-here"))
out["write_home"] = attempt(lambda: write(cfg["home"] + "/agent-was-here"))
out["write_workdir"] = attempt(lambda: write(cfg["workdir"] + "/agent-was-here"))
for place in ("/usr/agent", "/etc/agent", "/opt/agent", "/agent", "/dev/agent",
              "/proc/agent", cfg["suid_dir"] + "/agent"):
    out["write " + place] = attempt(lambda p=place: write(p))
out["interfaces"] = sorted(name for _, name in socket.if_nameindex())
def connect():
    s = socket.create_connection(("127.0.0.1", cfg["port"]), timeout=2)
    s.close()
out["tcp_host_loopback"] = attempt(connect)
status = dict(line.split(":", 1) for line in read("/proc/self/status").splitlines())
out["CapEff"] = status["CapEff"].strip()
out["CapBnd"] = status["CapBnd"].strip()
out["NoNewPrivs"] = status["NoNewPrivs"].strip()
out["Seccomp"] = status["Seccomp"].strip()
out["suid_euid"] = subprocess.run([cfg["suid_id"], "-u"], capture_output=True,
                                  text=True).stdout.strip()
out["mount"] = attempt(lambda: call(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
out["unshare_mnt"] = attempt(lambda: call(libc.unshare(0x00020000)))
out["unshare_user"] = attempt(lambda: call(libc.unshare(0x10000000)))
def setns(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        call(libc.setns(fd, 0))
    finally:
        os.close(fd)
out["setns_self"] = attempt(lambda: setns("/proc/self/ns/mnt"))
out["setns_pid1"] = attempt(lambda: setns("/proc/1/ns/mnt"))
out["ptrace_pid1"] = attempt(lambda: call(libc.ptrace(16, 1, None, None)))

# Kernel keyring, typing into the controlling terminal, new namespaces by
# clone: numbers written out here, not taken from the code under test.
NR = {"x86_64": {"keyctl": 250, "add_key": 248, "request_key": 249, "clone": 56,
                 "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "ioctl": 16,
                 "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427},
      "aarch64": {"keyctl": 219, "add_key": 217, "request_key": 218, "clone": 220,
                  "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "ioctl": 29,
                  "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427},
      }[platform.machine()]
libc.syscall.restype = ctypes.c_long
def sys_call(name, *args):
    if libc.syscall(NR[name], *args) == -1:
        raise OSError(ctypes.get_errno(), "")
KEYCTL_JOIN_SESSION_KEYRING = 1
KEY_SPEC_PROCESS_KEYRING = ctypes.c_int(-2)
out["keyctl_join"] = attempt(lambda: sys_call("keyctl", KEYCTL_JOIN_SESSION_KEYRING, b"probe"))
out["add_key"] = attempt(lambda: sys_call("add_key", b"user", b"probe", b"x", 1,
                                          KEY_SPEC_PROCESS_KEYRING))
out["request_key"] = attempt(lambda: sys_call("request_key", b"user", b"probe", None, 0))

# Issue 10: large kernel attack surfaces. Each fails otherwise with another
# error (or works): bpf EINVAL/EPERM by sysctl, perf_event_open and
# userfaultfd in user mode work, io_uring_setup works, the others EBADF.
bpf_attr = ctypes.create_string_buffer(128)
out["bpf"] = attempt(lambda: sys_call("bpf", 0, bpf_attr, 128))
perf_attr = ctypes.create_string_buffer(128)
struct_pe = (1).to_bytes(4, "little") + (128).to_bytes(4, "little") + (1).to_bytes(8, "little")
ctypes.memmove(perf_attr, struct_pe, len(struct_pe))  # type SOFTWARE, size, TASK_CLOCK
perf_attr[40] = 0x20  # exclude_kernel
out["perf_event_open"] = attempt(lambda: sys_call("perf_event_open", perf_attr, 0, -1, -1, 0))
out["userfaultfd"] = attempt(lambda: sys_call("userfaultfd", 1))  # UFFD_USER_MODE_ONLY
uring_params = ctypes.create_string_buffer(120)
out["io_uring_setup"] = attempt(lambda: sys_call("io_uring_setup", 1, uring_params))
out["io_uring_enter"] = attempt(lambda: sys_call("io_uring_enter", -1, 0, 0, 0, None, 0))
out["io_uring_register"] = attempt(lambda: sys_call("io_uring_register", -1, 0, None, 0))
# On /dev/null these say ENOTTY without the filter.
null_fd = os.open("/dev/null", os.O_RDWR)
one_char = ctypes.create_string_buffer(b"#")
out["tioclinux"] = attempt(lambda: sys_call("ioctl", null_fd, 0x541C, one_char))
out["tiocsti_high_bits"] = attempt(
    lambda: sys_call("ioctl", null_fd, ctypes.c_ulong(0x1_0000_5412), one_char))

def tiocsti_on_controlling_tty():
    # pty.fork's child is a session leader with the pty as its controlling
    # terminal: the one case the kernel itself still allows.
    import fcntl
    import pty
    import termios
    pid, master = pty.fork()
    if pid == 0:
        try:
            fcntl.ioctl(0, termios.TIOCSTI, b"#")
            os._exit(0)
        except OSError as e:
            os._exit(e.errno)
    # The master stays open until the child is done: closing it first hangs
    # the terminal up, and the ioctl then fails whatever the filter says.
    status = os.waitpid(pid, 0)[1]
    os.close(master)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise OSError(code, "")
out["tiocsti_ctty"] = attempt(tiocsti_on_controlling_tty)

SIGCHLD = 17
NAMESPACE_FLAGS = {"NEWNS": 0x00020000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000,
                   "NEWIPC": 0x08000000, "NEWUSER": 0x10000000, "NEWPID": 0x20000000,
                   "NEWNET": 0x40000000}
def clone_with(flags):
    libc.syscall.restype = ctypes.c_long
    pid = libc.syscall(NR["clone"], ctypes.c_ulong(flags | SIGCHLD), None, None, None, None)
    if pid == -1:
        raise OSError(ctypes.get_errno(), "")
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
for flag_name, flag in NAMESPACE_FLAGS.items():
    # With CLONE_NEWUSER the kernel would grant every other namespace to a
    # process without capabilities: only the filter stands in the way.
    out["clone " + flag_name] = attempt(lambda f=flag: clone_with(f | NAMESPACE_FLAGS["NEWUSER"]))

def mount_table():
    rows = []
    for line in read("/proc/self/mountinfo").splitlines():
        left, right = line.split(" - ", 1)
        fields = left.split()
        rows.append({"target": fields[4], "options": fields[5], "fstype": right.split()[0]})
    return rows
out["mounts"] = mount_table()
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["env"] = dict(os.environ)
out["uid"] = list(os.getresuid())
out["cwd"] = os.getcwd()
out["hostname"] = socket.gethostname()
print(json.dumps(out))
