# attack: fs_list_root_home
# category: filesystem
# attempts: list /root and read files in it (.bashrc, .profile), printing a digest of the listing
# expect: listing fails (EACCES/ENOENT) or shows an empty private directory
# control: yes
# canaries: host_files
import errno
import hashlib
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    names = sorted(os.listdir("/root"))
    print("DIGEST:" + hashlib.sha256("\n".join(names).encode()).hexdigest())
    readable = []
    for name in names:
        try:
            with open(os.path.join("/root", name), "rb") as f:
                f.read(64)
            readable.append(name)
        except OSError:
            pass
    if names:
        report("escaped", "listed %d entries in /root, %d readable" % (len(names), len(readable)))
    else:
        report("blocked", "/root is empty in the cell")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
