# attack: fs_proc_sys_write
# category: filesystem
# attempts: open kernel control files for writing (core_pattern, sysrq-trigger, modprobe, uevent_helper); nothing is ever written
# expect: every open fails (EACCES/EROFS/ENOENT): /proc/sys and /sys are read-only or absent in the cell
# control: no
# canaries: none
import errno
import os

opened = []
denied = []
for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/proc/sys/kernel/modprobe", "/sys/kernel/uevent_helper", "/proc/sys/vm/drop_caches"):
    try:
        fd = os.open(path, os.O_WRONLY)
        os.close(fd)
        opened.append(path)
    except OSError as e:
        denied.append("%s:%s" % (os.path.basename(path), errno.errorcode.get(e.errno, str(e.errno))))
if opened:
    print("ATTACK-RESULT: escaped opened for writing: " + ", ".join(opened), flush=True)
else:
    print("ATTACK-RESULT: blocked " + " ".join(denied), flush=True)
