# attack: proc_tiocsti
# category: process
# attempts: TIOCSTI (push bytes into a terminal's input queue) on a fresh pty of its own, and on fds 0-2 when they are not terminals
# expect: ioctl fails with EPERM from seccomp; a kernel answer (success, ENOTTY, EIO) means TIOCSTI reached the kernel
# control: no
# canaries: none
import ctypes
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
TIOCSTI = 0x5412
targets = []
try:
    master, slave = os.openpty()
    targets.append(("pty", slave))
except OSError as e:
    master = None
    print("openpty:", errno.errorcode.get(e.errno, str(e.errno)))
# fds 0-2 only when they are not terminals: a failing sandbox must not
# inject into a real terminal; on a pipe a kernel answer is ENOTTY.
targets += [("fd%d" % fd, fd) for fd in (0, 1, 2) if not os.isatty(fd)]
reached = []
denied = []
ch = ctypes.c_char(b"#")
for name, fd in targets:
    r = libc.ioctl(fd, ctypes.c_ulong(TIOCSTI), ctypes.byref(ch))
    e = ctypes.get_errno()
    if r == 0:
        reached.append(name + ":injected")
    elif e == errno.EPERM:
        denied.append(name + ":EPERM")
    else:
        reached.append("%s:%s" % (name, errno.errorcode.get(e, str(e))))
if reached:
    report("escaped", "TIOCSTI reached the kernel: " + " ".join(reached))
else:
    report("blocked", " ".join(denied))
