# attack: proc_personality
# category: process
# attempts: personality(READ_IMPLIES_EXEC|ADDR_NO_RANDOMIZE) to get executable data and no ASLR for the next exec
# expect: EPERM from seccomp (only the query 0xffffffff may pass) or SIGSYS; the persona reads back unchanged
# control: yes
# canaries: none
import ctypes
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


libc = ctypes.CDLL(None, use_errno=True)
libc.personality.restype = ctypes.c_int
READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE = 0x0400000, 0x0040000
want = READ_IMPLIES_EXEC | ADDR_NO_RANDOMIZE
r = libc.personality(ctypes.c_ulong(want))
if r < 0:
    e = ctypes.get_errno()
    report("blocked", errno.errorcode.get(e, str(e)))
else:
    now = libc.personality(ctypes.c_ulong(0xffffffff))
    if now >= 0 and now & want == want:
        report("escaped", "persona is now 0x%x" % now)
    else:
        report("blocked", "set returned %d but persona reads 0x%x" % (r, now & 0xffffffff))
