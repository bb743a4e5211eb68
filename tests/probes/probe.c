/* Escape probes run inside a cell by tests/suite/isolation.rs.
 *
 * Each subcommand tries one thing and prints one line: "ok" or
 * "errno=<n>", so the test can assert the exact denial. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

static int result(long rc) {
    if (rc < 0) {
        printf("errno=%d\n", errno);
        return 0;
    }
    printf("ok\n");
    return 0;
}

static int tcp(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) { printf("socket errno=%d\n", errno); return 0; }
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) { printf("connect errno=%d\n", errno); return 0; }
    printf("ok\n");
    return 0;
}

static int udp(int port) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) { printf("socket errno=%d\n", errno); return 0; }
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (sendto(s, "x", 1, 0, (struct sockaddr *)&a, sizeof a) < 0) { printf("sendto errno=%d\n", errno); return 0; }
    printf("ok\n");
    return 0;
}

static int unix_connect(const char *path) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0) { printf("socket errno=%d\n", errno); return 0; }
    struct sockaddr_un a = {0};
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) { printf("connect errno=%d\n", errno); return 0; }
    printf("ok\n");
    return 0;
}

static int forkbomb(void) {
    int n = 0;
    for (;;) {
        pid_t p = fork();
        if (p == 0) { pause(); _exit(0); }
        if (p < 0) break;
        n++;
        if (n > 100000) break;
    }
    printf("forked=%d errno=%d\n", n, errno);
    fflush(stdout);
    return 0;
}

static int membomb(void) {
    size_t chunk = 16u << 20, total = 0;
    for (;;) {
        char *p = malloc(chunk);
        if (!p) break;
        memset(p, 1, chunk);
        total += chunk;
        if (total > ((size_t)64 << 30)) break;
    }
    printf("allocated_mib=%zu errno=%d\n", total >> 20, errno);
    return 0;
}

static int limits(void) {
    static const struct { const char *name; int res; } r[] = {
        {"cpu", RLIMIT_CPU}, {"as", RLIMIT_AS}, {"fsize", RLIMIT_FSIZE},
        {"nofile", RLIMIT_NOFILE}, {"nproc", RLIMIT_NPROC}, {"core", RLIMIT_CORE},
        {"stack", RLIMIT_STACK},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        struct rlimit l;
        if (getrlimit(r[i].res, &l) < 0) { printf("%s errno=%d\n", r[i].name, errno); continue; }
        printf("%s=%llu/%llu\n", r[i].name, (unsigned long long)l.rlim_cur, (unsigned long long)l.rlim_max);
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    const char *cmd = argv[1];
    const char *arg = argc > 2 ? argv[2] : "";
    if (!strcmp(cmd, "write")) return result(open(arg, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    if (!strcmp(cmd, "read")) return result(open(arg, O_RDONLY));
    if (!strcmp(cmd, "tcp")) return tcp(atoi(arg));
    if (!strcmp(cmd, "udp")) return udp(atoi(arg));
    if (!strcmp(cmd, "unix")) return unix_connect(arg);
    if (!strcmp(cmd, "kill")) return result(kill(atoi(arg), SIGKILL));
    if (!strcmp(cmd, "ptrace-parent")) {
        /* A child attaches to its parent, which exists inside the cell. */
        pid_t child = fork();
        if (child < 0) { printf("fork errno=%d\n", errno); return 0; }
        if (child == 0) { result(ptrace(PTRACE_ATTACH, getppid(), 0, 0)); fflush(stdout); _exit(0); }
        waitpid(child, NULL, 0);
        return 0;
    }
    if (!strcmp(cmd, "unshare-user")) return result(unshare(CLONE_NEWUSER));
    if (!strcmp(cmd, "clone-newuser")) {
        long rc = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
        if (rc == 0) _exit(0);
        return result(rc);
    }
    if (!strcmp(cmd, "clone3")) {
        uint64_t args[11] = {0};
        args[4] = SIGCHLD; /* exit_signal */
        long rc = syscall(SYS_clone3, args, sizeof args);
        if (rc == 0) _exit(0);
        return result(rc);
    }
    if (!strcmp(cmd, "mount")) return result(mount("none", "/tmp", "tmpfs", 0, NULL));
    if (!strcmp(cmd, "tiocsti")) {
        char c = 'x';
        printf("plain ");
        result(syscall(SYS_ioctl, 1, (unsigned long)TIOCSTI, &c));
        printf("high ");
        return result(syscall(SYS_ioctl, 1, (unsigned long)TIOCSTI | (1UL << 32), &c));
    }
    if (!strcmp(cmd, "tcgets")) {
        struct termios t;
        long rc = syscall(SYS_ioctl, 0, (unsigned long)TCGETS, &t);
        return result(rc);
    }
    if (!strcmp(cmd, "forkbomb")) return forkbomb();
    if (!strcmp(cmd, "membomb")) return membomb();
    if (!strcmp(cmd, "rlimits")) return limits();
    if (!strcmp(cmd, "syscalls")) {
        /* Each remaining argument is a syscall number, called with zero args. */
        for (int i = 2; i < argc; i++) {
            long nr = atol(argv[i]);
            errno = 0;
            long rc = syscall(nr, 0, 0, 0, 0, 0, 0);
            printf("%ld %s\n", nr, rc < 0 ? "" : "ok");
            if (rc < 0) printf("%ld errno=%d\n", nr, errno);
        }
        return 0;
    }
    if (!strcmp(cmd, "syscall")) {
        long rc = syscall(atol(arg), 0, 0, 0, 0, 0, 0);
        return result(rc);
    }
    return 2;
}
