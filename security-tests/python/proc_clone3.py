# attack: proc_clone3
# category: process
# attempts: raw clone3 with CLONE_NEWUSER|CLONE_NEWNS (seccomp cannot read clone3's flags, so it must refuse clone3 outright)
# expect: ENOSYS (so libc falls back to clone) or EPERM
# control: yes
# canaries: none
import ctypes
import errno
import os
import struct


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17
# struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls (CLONE_ARGS_SIZE_VER0 = 64)
args = ctypes.create_string_buffer(struct.pack("=8Q", CLONE_NEWUSER | CLONE_NEWNS, 0, 0, 0, SIGCHLD, 0, 0, 0), 64)
pid = libc.syscall(ctypes.c_long(435), args, ctypes.c_size_t(64))
if pid == 0:
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
    report("escaped", "clone3 created a child in new user+mount namespaces")
else:
    e = ctypes.get_errno()
    report("blocked", errno.errorcode.get(e, str(e)))
