# attack: fs_symlink_write
# category: filesystem
# attempts: plant a symlink in scratch pointing outside, then create a file through it
# expect: the open through the link fails (EACCES/ENOENT): access is checked on the resolved path
# control: yes
# canaries: scratch_escape
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    os.symlink("{{OUTSIDE_DIR}}/via-symlink", "out-link")
    with open("out-link", "w") as f:
        f.write("written through a symlink\n")
    report("escaped", "created a file outside scratch through a symlink")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
