# attack: proc_chroot
# category: process
# attempts: chroot into a scratch subdirectory (the first step of the classic chroot-then-climb escape)
# expect: EPERM (seccomp; no CAP_SYS_CHROOT)
# control: yes
# canaries: none
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


os.mkdir("jail")
try:
    os.chroot("jail")
    report("escaped", "chroot succeeded")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
