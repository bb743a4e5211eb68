# attack: fs_rename_out
# category: filesystem
# attempts: create a file in scratch and rename/replace it into the outside directory (also via renameat2 RENAME_NOREPLACE)
# expect: rename fails (EXDEV across mounts, EACCES from Landlock, ENOENT)
# control: yes
# canaries: scratch_escape
import ctypes
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


got = []
denials = []
with open("to-move", "w") as f:
    f.write("moved out of scratch\n")
try:
    os.rename("to-move", "{{OUTSIDE_DIR}}/renamed")
    got.append("rename")
except OSError as e:
    denials.append("rename:" + errno.errorcode.get(e.errno, str(e.errno)))
if not got:
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD = -100
    RENAME_NOREPLACE = 1
    r = libc.renameat2(AT_FDCWD, b"to-move", AT_FDCWD, b"{{OUTSIDE_DIR}}/renamed2", RENAME_NOREPLACE)
    if r == 0:
        got.append("renameat2")
    else:
        e = ctypes.get_errno()
        denials.append("renameat2:" + errno.errorcode.get(e, str(e)))
if got:
    report("escaped", "moved a scratch file outside with " + ",".join(got))
else:
    report("blocked", " ".join(denials))
