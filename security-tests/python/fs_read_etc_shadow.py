# attack: fs_read_etc_shadow
# category: filesystem
# attempts: open and read /etc/shadow, printing a digest of what was read
# expect: open fails (EACCES from Landlock/permissions or ENOENT from the mount namespace)
# control: yes
# canaries: host_files
import errno
import hashlib


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    with open("/etc/shadow", "rb") as f:
        data = f.read()
    print("DIGEST:" + hashlib.sha256(data).hexdigest())
    report("escaped", "read %d bytes of /etc/shadow" % len(data))
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
