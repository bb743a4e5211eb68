# attack: fs_mknod
# category: filesystem
# attempts: mknod a character device (1:3, like /dev/null) and a block device (7:0, a loop device) in scratch
# expect: EPERM (no CAP_MKNOD; seccomp) or EACCES (Landlock MAKE_CHAR/MAKE_BLOCK not granted)
# control: no
# canaries: none
import errno
import os
import stat


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


made = []
denials = []
for name, kind, dev in (("chr-node", stat.S_IFCHR, os.makedev(1, 3)), ("blk-node", stat.S_IFBLK, os.makedev(7, 0))):
    try:
        os.mknod(name, 0o600 | kind, dev)
        made.append(name)
    except OSError as e:
        denials.append("%s:%s" % (name, errno.errorcode.get(e.errno, str(e.errno))))
if made:
    report("escaped", "created device nodes " + ",".join(made))
else:
    report("blocked", " ".join(denials))
