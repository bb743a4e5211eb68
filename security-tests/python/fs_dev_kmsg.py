# attack: fs_dev_kmsg
# category: filesystem
# attempts: read one record of the kernel log from /dev/kmsg (non-blocking, read only)
# expect: ENOENT (no device node in the cell) or EACCES/EPERM
# control: yes
# canaries: none
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        rec = os.read(fd, 8192)
    finally:
        os.close(fd)
    report("escaped", "read a kernel log record of %d bytes" % len(rec))
except BlockingIOError:
    report("escaped", "opened /dev/kmsg (no record pending)")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
