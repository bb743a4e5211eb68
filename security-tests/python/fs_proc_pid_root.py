# attack: fs_proc_pid_root
# category: filesystem
# attempts: reach the host filesystem through /proc/<supervisor>/root and /proc/1/root, then read the secret and write outside
# expect: ENOENT (PID namespace) or EACCES (ptrace access check / Landlock)
# control: yes
# canaries: secret_file, scratch_escape
import errno


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


got = []
denials = []
for base in ("/proc/{{SUPERVISOR_PID}}/root", "/proc/1/root", "/proc/{{SUPERVISOR_PID}}/cwd/.."):
    try:
        with open(base + "{{SECRET_PATH}}") as f:
            print(f.read())
        got.append("read via " + base)
    except OSError as e:
        denials.append(errno.errorcode.get(e.errno, str(e.errno)))
    try:
        with open(base + "{{OUTSIDE_DIR}}/via-proc-root", "w") as f:
            f.write("x\n")
        got.append("wrote via " + base)
    except OSError as e:
        denials.append(errno.errorcode.get(e.errno, str(e.errno)))
if got:
    report("escaped", "; ".join(got))
else:
    report("blocked", " ".join(sorted(set(denials))))
