# attack: fs_symlink_read
# category: filesystem
# attempts: plant symlinks in scratch to the planted secret and to the outside directory, read through them
# expect: reads through the links fail (EACCES/ENOENT)
# control: yes
# canaries: secret_file
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    os.symlink("{{SECRET_PATH}}", "secret-link")
    os.symlink("{{OUTSIDE_DIR}}", "dir-link")
    with open("secret-link") as f:
        data = f.read()
    print(data)
    report("escaped", "read the secret through a symlink")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
