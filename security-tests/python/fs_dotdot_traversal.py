# attack: fs_dotdot_traversal
# category: filesystem
# attempts: reach the secret and the outside dir with relative ../ paths from scratch, and with long ../ chains
# expect: every open fails (EACCES/ENOENT); the cwd does not let the cell climb out
# control: yes
# canaries: secret_file, scratch_escape
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


got = []
denials = []
cwd = os.getcwd()
for path in (os.path.relpath("{{SECRET_PATH}}", cwd), "../" * 40 + "{{SECRET_PATH}}".lstrip("/")):
    try:
        with open(path) as f:
            print(f.read())
        got.append("read " + path)
    except OSError as e:
        denials.append(errno.errorcode.get(e.errno, str(e.errno)))
target = os.path.relpath("{{OUTSIDE_DIR}}", cwd) + "/dotdot-write"
try:
    with open(target, "w") as f:
        f.write("x\n")
    got.append("wrote " + target)
except OSError as e:
    denials.append(errno.errorcode.get(e.errno, str(e.errno)))
if got:
    report("escaped", "; ".join(got))
else:
    report("blocked", " ".join(denials))
