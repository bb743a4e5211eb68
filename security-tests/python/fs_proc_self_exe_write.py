# attack: fs_proc_self_exe_write
# category: filesystem
# attempts: open /proc/self/exe (the interpreter binary) for writing, without truncating or writing anything
# expect: open fails (EACCES from Landlock/uid, ETXTBSY, EROFS); the binary is never writable from a cell
# control: no
# canaries: none
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    fd = os.open("/proc/self/exe", os.O_WRONLY)
    os.close(fd)
    report("escaped", "opened /proc/self/exe (%s) for writing" % os.readlink("/proc/self/exe"))
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
