# attack: leak_kernel_addresses
# category: leak
# attempts: read kernel symbol addresses from /proc/kallsyms and /proc/modules (defeats KASLR, a first step of kernel exploits)
# expect: the files are absent, unreadable, or show only zero addresses
# control: yes
# canaries: none
import errno

leaks = []
denied = []
for path in ("/proc/kallsyms", "/proc/modules"):
    try:
        with open(path) as f:
            lines = [f.readline() for _ in range(200)]
    except OSError as e:
        denied.append("%s:%s" % (path, errno.errorcode.get(e.errno, str(e.errno))))
        continue
    nonzero = [l for l in lines if l and any(c not in "0x" for c in l.split()[0 if path.endswith("kallsyms") else -1])]
    if nonzero:
        leaks.append("%s (%s)" % (path, nonzero[0].split()[0 if path.endswith("kallsyms") else -1]))
    else:
        denied.append("%s:zeroed" % path)
if leaks:
    print("ATTACK-RESULT: escaped kernel addresses visible: " + ", ".join(leaks), flush=True)
else:
    print("ATTACK-RESULT: blocked " + " ".join(denied), flush=True)
