# attack: proc_ctypes_system
# category: process
# attempts: libc system() through ctypes (fork + exec /bin/sh outside Python's subprocess module)
# expect: the shell never runs: exec fails (EACCES/EPERM) and system() returns non-zero; no "SYS-42" in output
# control: yes
# canaries: none
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
rc = libc.system(b"echo SYS-$((6*7)); exit 7")
code = os.waitstatus_to_exitcode(rc) if rc >= 0 else rc
if code == 7:
    print("ATTACK-RESULT: escaped system() ran /bin/sh", flush=True)
else:
    print("ATTACK-RESULT: blocked system() returned %d (errno %d)" % (code, ctypes.get_errno()), flush=True)
