# attack: proc_capabilities
# category: process
# attempts: read its own credentials: capability sets, no_new_privs, seccomp mode, uid
# expect: CapEff/CapPrm/CapAmb all zero, NoNewPrivs 1, Seccomp 2, a non-zero uid
# control: yes
# canaries: none
problems = []
with open("/proc/self/status") as f:
    status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
for key in ("CapEff", "CapPrm", "CapAmb"):
    if int(status.get(key, "0"), 16) != 0:
        problems.append("%s=%s" % (key, status[key]))
if status.get("NoNewPrivs", "0").strip() != "1":
    problems.append("NoNewPrivs=%s" % status.get("NoNewPrivs"))
if status.get("Seccomp", "0").strip() != "2":
    problems.append("Seccomp=%s" % status.get("Seccomp"))
uids = status.get("Uid", "").split()
if "0" in uids:
    problems.append("Uid=%s" % " ".join(uids))
if problems:
    print("ATTACK-RESULT: escaped the cell holds privileges: " + " ".join(problems), flush=True)
else:
    print("ATTACK-RESULT: blocked no capabilities, no_new_privs, seccomp filter, uid " + uids[0], flush=True)
