# attack: proc_unshare
# category: process
# attempts: unshare(CLONE_NEWUSER), then CLONE_NEWNS, CLONE_NEWNET and CLONE_NEWPID, each on its own (user namespaces re-grant capabilities)
# expect: every call fails with EPERM (seccomp; no capabilities)
# control: yes
# canaries: none
import ctypes
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
flags = (("CLONE_NEWUSER", 0x10000000), ("CLONE_NEWNS", 0x00020000), ("CLONE_NEWNET", 0x40000000), ("CLONE_NEWPID", 0x20000000))
ok = []
denials = []
for name, flag in flags:
    if libc.unshare(flag) == 0:
        ok.append(name)
    else:
        e = ctypes.get_errno()
        denials.append("%s:%s" % (name, errno.errorcode.get(e, str(e))))
if ok:
    report("escaped", "unshare succeeded for " + ",".join(ok))
else:
    report("blocked", " ".join(denials))
