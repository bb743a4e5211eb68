# attack: proc_mount
# category: process
# attempts: mount a tmpfs on a directory in scratch and bind-mount an empty scratch directory onto another (unmounted again at once if it worked; never a bind of / that a scratch cleanup could walk into)
# expect: EPERM (seccomp; no CAP_SYS_ADMIN in any namespace the cell owns)
# control: no
# canaries: none
import ctypes
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
os.mkdir("mnt-tmpfs")
os.mkdir("mnt-bind")
os.mkdir("bind-src")
ok = []
denials = []
if libc.mount(b"none", b"mnt-tmpfs", b"tmpfs", 0, b"size=1m") == 0:
    ok.append("tmpfs")
    libc.umount2(b"mnt-tmpfs", 2)
else:
    e = ctypes.get_errno()
    denials.append("tmpfs:" + errno.errorcode.get(e, str(e)))
MS_BIND, MS_REC = 4096, 16384
if libc.mount(b"bind-src", b"mnt-bind", None, MS_BIND | MS_REC, None) == 0:
    ok.append("bind")
    libc.umount2(b"mnt-bind", 2)
else:
    e = ctypes.get_errno()
    denials.append("bind:" + errno.errorcode.get(e, str(e)))
if ok:
    report("escaped", "mount succeeded: " + ",".join(ok))
else:
    report("blocked", " ".join(denials))
