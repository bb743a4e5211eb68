# attack: proc_exec_setuid
# category: process
# attempts: exec a setuid-root binary (su, else passwd) that waits on stdin, and read its effective uid and capabilities while it waits
# expect: exec fails (EACCES/EPERM), or no_new_privs keeps the child's euid and capabilities those of the cell (never 0)
# control: yes
# canaries: none
import errno
import os
import subprocess
import time


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


if os.geteuid() == 0:
    report("escaped", "the cell itself runs with euid 0")
else:
    denials = []
    for binary in ("/usr/bin/su", "/usr/bin/passwd"):
        try:
            p = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as e:
            denials.append("%s:%s" % (binary, errno.errorcode.get(e.errno, str(e.errno))))
            continue
        euids = set()
        caps = set()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline and p.poll() is None:
            try:
                with open("/proc/%d/status" % p.pid) as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            euids.add(int(line.split()[2]))
                        elif line.startswith("CapEff:"):
                            caps.add(int(line.split()[1], 16))
            except OSError:
                pass
            time.sleep(0.01)
        p.kill()
        p.wait()
        if 0 in euids or any(caps):
            report("escaped", "%s ran with euid %s caps %s" % (binary, sorted(euids), [hex(c) for c in caps]))
            break
        denials.append("%s:euid %s" % (binary, sorted(euids)))
    else:
        report("blocked", " ".join(denials))
