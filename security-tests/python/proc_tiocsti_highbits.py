# attack: proc_tiocsti_highbits
# category: process
# attempts: TIOCSTI with garbage in the upper 32 bits of the request (the kernel truncates cmd to 32 bits; a filter comparing 64 bits misses it)
# expect: ioctl fails with EPERM from seccomp (requests compared on their low 32 bits); any kernel answer is a filter gap
# control: no
# canaries: none
import ctypes
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
targets = []
try:
    master, slave = os.openpty()
    targets.append(("pty", slave))
except OSError as e:
    print("openpty:", errno.errorcode.get(e.errno, str(e.errno)))
# fds 0-1 only when they are not terminals: a failing sandbox must not
# inject into a real terminal; on a pipe a kernel answer is ENOTTY.
targets += [("fd%d" % fd, fd) for fd in (0, 1) if not os.isatty(fd)]
reached = []
denied = []
ch = ctypes.c_char(b"#")
for high in (0xDEADBEEF00000000, 0x0000000100000000):
    req = high | 0x5412
    for name, fd in targets:
        # Raw syscall so libc cannot normalise the request.
        r = libc.syscall(ctypes.c_long(16), ctypes.c_long(fd), ctypes.c_ulong(req), ctypes.byref(ch))
        e = ctypes.get_errno()
        if r == 0:
            reached.append("%s/%x:injected" % (name, high >> 32))
        elif e == errno.EPERM:
            denied.append("%s/%x:EPERM" % (name, high >> 32))
        else:
            reached.append("%s/%x:%s" % (name, high >> 32, errno.errorcode.get(e, str(e))))
if reached:
    report("escaped", "high-bit TIOCSTI reached the kernel: " + " ".join(reached))
else:
    report("blocked", " ".join(denied))
