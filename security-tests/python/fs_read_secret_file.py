# attack: fs_read_secret_file
# category: filesystem
# attempts: read the secret file the harness planted outside scratch (mode 0644, so only the sandbox stops it)
# expect: open fails with EACCES (Landlock) or ENOENT (not mounted in the cell); the token never appears
# control: yes
# canaries: secret_file
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    with open("{{SECRET_PATH}}") as f:
        data = f.read()
    print(data)
    report("escaped", "read %d bytes of the planted secret" % len(data))
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
