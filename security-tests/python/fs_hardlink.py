# attack: fs_hardlink
# category: filesystem
# attempts: hard-link the planted secret into scratch and read it; hard-link a scratch file into the outside dir
# expect: link fails (EXDEV, EACCES from Landlock, EPERM) or the source is invisible (ENOENT)
# control: yes
# canaries: secret_file, scratch_escape
import errno
import os


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


got = []
denials = []
try:
    os.link("{{SECRET_PATH}}", "secret-hardlink")
    with open("secret-hardlink") as f:
        print(f.read())
    got.append("read the secret through a hard link")
except OSError as e:
    denials.append("in:" + errno.errorcode.get(e.errno, str(e.errno)))
try:
    with open("local-file", "w") as f:
        f.write("x\n")
    os.link("local-file", "{{OUTSIDE_DIR}}/via-hardlink")
    got.append("hard-linked a file into the outside dir")
except OSError as e:
    denials.append("out:" + errno.errorcode.get(e.errno, str(e.errno)))
if got:
    report("escaped", "; ".join(got))
else:
    report("blocked", " ".join(denials))
