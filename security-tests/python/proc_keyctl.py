# attack: proc_keyctl
# category: process
# attempts: add_key into the process keyring and keyctl(KEYCTL_GET_KEYRING_ID) on the user keyring (kernel keyrings are shared with the host user)
# expect: EPERM (seccomp) or SIGSYS
# control: yes
# canaries: none
import ctypes
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEY_SPEC_PROCESS_KEYRING, KEY_SPEC_USER_KEYRING = -2, -4
ok = []
denials = []
serial = libc.syscall(ctypes.c_long(248), b"user", b"{{MARKER}}", b"x", ctypes.c_size_t(1), ctypes.c_int(KEY_SPEC_PROCESS_KEYRING))
if serial >= 0:
    ok.append("add_key")
else:
    e = ctypes.get_errno()
    denials.append("add_key:" + errno.errorcode.get(e, str(e)))
r = libc.syscall(ctypes.c_long(250), ctypes.c_int(0), ctypes.c_int(KEY_SPEC_USER_KEYRING), ctypes.c_int(0))
if r >= 0:
    ok.append("keyctl")
else:
    e = ctypes.get_errno()
    denials.append("keyctl:" + errno.errorcode.get(e, str(e)))
if ok:
    report("escaped", "keyring calls succeeded: " + ",".join(ok))
else:
    report("blocked", " ".join(denials))
