# attack: fs_write_host_tmp
# category: filesystem
# attempts: drop a marked file in every world-writable directory a host has (/tmp, /var/tmp, /dev/shm, /run/lock) and in scratch's parent
# expect: each write fails or lands in a cell-private directory; the harness finds no marked file on the host
# control: yes
# canaries: host_tmp
import errno
import os

written = []
denied = []
targets = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", os.path.dirname(os.getcwd())]
for d in targets:
    path = os.path.join(d, "{{MARKER}}-host-tmp")
    try:
        with open(path, "w") as f:
            f.write("written from the cell\n")
        written.append(d)
    except OSError as e:
        denied.append("%s:%s" % (d, errno.errorcode.get(e.errno, str(e.errno))))
# Writes that succeed may still be cell-private (a private /tmp); the harness
# checks the host side.
print("written:", written, "denied:", denied)
print("ATTACK-RESULT: attempted %d writes accepted; the host check decides" % len(written), flush=True)
