# attack: fs_dev_mem
# category: filesystem
# attempts: open /dev/mem, /dev/kmem and /dev/port read-only (no read is made)
# expect: ENOENT (no such node in the cell) or EACCES/EPERM
# control: no
# canaries: none
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


opened = []
denials = []
for path in ("/dev/mem", "/dev/kmem", "/dev/port"):
    try:
        fd = os.open(path, os.O_RDONLY)
        os.close(fd)
        opened.append(path)
    except OSError as e:
        denials.append("%s:%s" % (path, errno.errorcode.get(e.errno, str(e.errno))))
if opened:
    report("escaped", "opened " + ",".join(opened))
else:
    report("blocked", " ".join(denials))
