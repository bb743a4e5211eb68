# attack: fs_write_outside
# category: filesystem
# attempts: create a file directly in a world-writable directory outside scratch
# expect: open(O_CREAT) fails with EACCES (Landlock) or ENOENT/EROFS (not in the cell's mount view)
# control: yes
# canaries: scratch_escape
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


try:
    with open("{{OUTSIDE_DIR}}/direct-write", "w") as f:
        f.write("written from the cell\n")
    report("escaped", "created {{OUTSIDE_DIR}}/direct-write")
except OSError as e:
    report("blocked", errno.errorcode.get(e.errno, str(e.errno)))
