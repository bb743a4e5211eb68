# attack: proc_setuid_root
# category: process
# attempts: setuid(0), setgid(0), setgroups([0]) and setresuid(0,0,0)
# expect: EPERM for every call: the cell has no CAP_SETUID/CAP_SETGID and no mapping to uid 0
# control: yes
# canaries: none
import errno
import os

got = []
denied = []
for name, fn in (("setgroups", lambda: os.setgroups([0])), ("setgid", lambda: os.setgid(0)), ("setresuid", lambda: os.setresuid(0, 0, 0)), ("setuid", lambda: os.setuid(0))):
    try:
        fn()
        got.append(name)
    except OSError as e:
        denied.append("%s:%s" % (name, errno.errorcode.get(e.errno, str(e.errno))))
if got and os.geteuid() == 0:
    print("ATTACK-RESULT: escaped now euid 0 via " + ",".join(got), flush=True)
elif got:
    print("ATTACK-RESULT: escaped identity calls succeeded: " + ",".join(got), flush=True)
else:
    print("ATTACK-RESULT: blocked " + " ".join(denied), flush=True)
