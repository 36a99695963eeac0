/* Run inside a container agent (whose image has no python) by
 * tests/integration/test_container.py: tries each refused system call and a
 * few ordinary ones, and prints one JSON object {"name": "ok" | "err:EPERM"}.
 * Built static in the test bed: gcc -static -O1 -pthread -o probe probe.c
 * System call numbers come from the C library's headers, never from the
 * code under test. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int first = 1;

static void report(const char *name, long rc) {
    int e = errno;
    printf("%s\"%s\": ", first ? "{" : ", ", name);
    first = 0;
    if (rc >= 0)
        printf("\"ok\"");
    else
        printf("\"err:%s\"", strerrorname_np(e) ? strerrorname_np(e) : "?");
}

static long clone_flags(unsigned long flags) {
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid((pid_t)pid, NULL, 0);
    return pid;
}

static void *thread_main(void *arg) { return arg; }

int main(void) {
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    char c = '#';

    errno = 0; report("unshare_user", syscall(SYS_unshare, CLONE_NEWUSER));
    errno = 0; report("unshare_mnt", syscall(SYS_unshare, CLONE_NEWNS));
    errno = 0; report("clone_newuser", clone_flags(CLONE_NEWUSER));
    errno = 0; report("clone_newnet", clone_flags(CLONE_NEWUSER | CLONE_NEWNET));
    {
        uint64_t args[11] = {0};
        args[0] = CLONE_NEWUSER;
        args[4] = SIGCHLD;
        errno = 0;
        long pid = syscall(SYS_clone3, args, sizeof args);
        if (pid == 0)
            _exit(0);
        if (pid > 0)
            waitpid((pid_t)pid, NULL, 0);
        report("clone3_newuser", pid);
    }
    {
        int fd = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
        errno = 0; report("setns", syscall(SYS_setns, fd, 0));
    }
    errno = 0; report("mount", syscall(SYS_mount, "none", "/tmp", "tmpfs", 0, NULL));
    errno = 0; report("umount2", syscall(SYS_umount2, "/tmp", MNT_DETACH));
    errno = 0; report("fsopen", syscall(SYS_fsopen, "tmpfs", 0));
    errno = 0; report("open_tree", syscall(SYS_open_tree, AT_FDCWD, "/tmp", 1 /* OPEN_TREE_CLONE */));
    errno = 0; report("keyctl", syscall(SYS_keyctl, 1 /* JOIN_SESSION_KEYRING */, "probe"));
    errno = 0; report("add_key", syscall(SYS_add_key, "user", "probe", "x", 1, -2));
    errno = 0; report("request_key", syscall(SYS_request_key, "user", "probe", NULL, 0));
    {
        char attr[128] = {0};
        errno = 0; report("bpf", syscall(SYS_bpf, 0 /* MAP_CREATE */, attr, sizeof attr));
    }
    {
        struct perf_event_attr pe;
        memset(&pe, 0, sizeof pe);
        pe.type = PERF_TYPE_SOFTWARE;
        pe.size = sizeof pe;
        pe.config = PERF_COUNT_SW_TASK_CLOCK;
        pe.exclude_kernel = 1;
        errno = 0; report("perf_event_open", syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0));
    }
    errno = 0; report("userfaultfd", syscall(SYS_userfaultfd, 1 /* UFFD_USER_MODE_ONLY */));
    {
        char handle[136] = {0};
        ((unsigned int *)handle)[0] = 128;
        errno = 0; report("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, handle, O_RDONLY));
    }
    {
        struct io_uring_params p;
        memset(&p, 0, sizeof p);
        errno = 0; report("io_uring_setup", syscall(SYS_io_uring_setup, 1, &p));
    }
    errno = 0; report("io_uring_enter", syscall(SYS_io_uring_enter, -1, 0, 0, 0, NULL, 0));
    errno = 0; report("io_uring_register", syscall(SYS_io_uring_register, -1, 0, NULL, 0));
    /* On /dev/null, without the filter, these fail with ENOTTY. */
    errno = 0; report("tiocsti", syscall(SYS_ioctl, devnull, TIOCSTI, &c));
    errno = 0; report("tioclinux", syscall(SYS_ioctl, devnull, TIOCLINUX, &c));
    errno = 0; report("tiocsti_high_bits", syscall(SYS_ioctl, devnull, 0x100000000UL | TIOCSTI, &c));
    /* Ordinary calls still work. */
    {
        int fds[2];
        int n = -1;
        errno = 0; report("pipe", pipe(fds));
        errno = 0; report("ioctl_fionread", ioctl(fds[0], FIONREAD, &n));
        errno = 0; report("ioctl_tcgets_enotty", ioctl(devnull, TCGETS, &n));
    }
    {
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        if (pid > 0)
            waitpid(pid, NULL, 0);
        report("fork", pid);
    }
    {
        pthread_t t;
        int rc = pthread_create(&t, NULL, thread_main, NULL);
        if (rc == 0)
            pthread_join(t, NULL);
        errno = rc;
        report("thread", rc == 0 ? 0 : -1);
    }
    printf("}\n");
    return 0;
}
