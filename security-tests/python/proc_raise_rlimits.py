# attack: proc_raise_rlimits
# category: process
# attempts: raise every sandbox rlimit back (soft to hard, hard to unlimited) and prlimit the supervisor's limits
# expect: raising a hard limit fails with EPERM (no CAP_SYS_RESOURCE); the limits the sandbox sets are finite; prlimit on the supervisor fails (ESRCH/EPERM)
# control: yes
# canaries: none
import errno
import resource


def report(kind, detail):
    print("ATTACK-RESULT:", kind, detail, flush=True)


INF = resource.RLIM_INFINITY
limits = {
    "CPU": resource.RLIMIT_CPU,
    "FSIZE": resource.RLIMIT_FSIZE,
    "NOFILE": resource.RLIMIT_NOFILE,
    "NPROC": resource.RLIMIT_NPROC,
    "AS": resource.RLIMIT_AS,
    "DATA": resource.RLIMIT_DATA,
    "CORE": resource.RLIMIT_CORE,
}
problems = []
denials = []
for name, res in limits.items():
    soft, hard = resource.getrlimit(res)
    if hard == INF and name not in ("AS", "DATA"):
        problems.append("%s hard limit is unlimited" % name)
        continue
    if hard == INF:
        continue
    try:
        resource.setrlimit(res, (INF, INF))
        now = resource.getrlimit(res)
        if now[1] == INF or now[1] > hard:
            problems.append("raised %s hard limit from %d to %s" % (name, hard, now[1]))
    except ValueError as e:
        # CPython turns EPERM from setrlimit into ValueError.
        denials.append("%s:%s" % (name, e))
    except OSError as e:
        denials.append("%s:%s" % (name, errno.errorcode.get(e.errno, str(e.errno))))
if resource.getrlimit(resource.RLIMIT_AS)[1] == INF and resource.getrlimit(resource.RLIMIT_DATA)[1] == INF:
    problems.append("neither AS nor DATA is limited")
try:
    old = resource.prlimit({{SUPERVISOR_PID}}, resource.RLIMIT_CORE)
    resource.prlimit({{SUPERVISOR_PID}}, resource.RLIMIT_CORE, old)
    problems.append("prlimit on the supervisor succeeded")
except OSError as e:
    denials.append("prlimit:" + errno.errorcode.get(e.errno, str(e.errno)))
if problems:
    report("escaped", "; ".join(problems))
else:
    report("blocked", " ".join(denials))
