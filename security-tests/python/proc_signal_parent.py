# attack: proc_signal_parent
# category: process
# attempts: signal its own parent process with signal 0 (a permission probe; in a zygote or fork-server model the parent is the pool every later cell comes from)
# expect: the parent is outside the cell's PID namespace (ppid 0) or the signal is refused (EPERM from Landlock signal scoping)
# control: yes
# canaries: none
import errno
import os

ppid = os.getppid()
if ppid <= 1:
    print("ATTACK-RESULT: blocked no parent visible (ppid %d)" % ppid, flush=True)
else:
    try:
        os.kill(ppid, 0)
        print("ATTACK-RESULT: escaped may signal its parent (pid %d)" % ppid, flush=True)
    except OSError as e:
        print("ATTACK-RESULT: blocked", errno.errorcode.get(e.errno, str(e.errno)), flush=True)
