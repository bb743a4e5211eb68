/* without FEATURE -- CMD ARGS...
 *
 * Runs CMD with a seccomp filter that makes the kernel look like it lacks
 * FEATURE, so tests can check that cellbox refuses a profile that requires
 * it (and degrades when it is best effort):
 *   landlock    landlock_create_ruleset fails with ENOSYS (no Landlock);
 *   namespaces  clone/unshare with any CLONE_NEW* flag fail with EPERM. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NS_FLAGS (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET)
#define NR offsetof(struct seccomp_data, nr)
#define ARCH offsetof(struct seccomp_data, arch)
#define ARG0 offsetof(struct seccomp_data, args[0])

int main(int argc, char **argv) {
    if (argc < 4 || strcmp(argv[2], "--")) return 2;
    struct sock_filter landlock[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARCH),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_landlock_create_ruleset, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    /* clone or unshare with any namespace flag in arg 0: EPERM. */
    struct sock_filter ns[] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARCH),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 5),
        /* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR),
        /* 3 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 1, 0),
        /* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unshare, 0, 2),
        /* 5 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG0),
        /* 6 */ BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NS_FLAGS, 1, 0),
        /* 7 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 8 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    };
    struct sock_fprog prog;
    if (!strcmp(argv[1], "landlock")) {
        prog.len = sizeof landlock / sizeof landlock[0];
        prog.filter = landlock;
    } else if (!strcmp(argv[1], "namespaces")) {
        prog.len = sizeof ns / sizeof ns[0];
        prog.filter = ns;
    } else {
        return 2;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) { perror("no_new_privs"); return 3; }
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) { perror("seccomp"); return 3; }
    execv(argv[3], argv + 3);
    perror("execv");
    return 127;
}
