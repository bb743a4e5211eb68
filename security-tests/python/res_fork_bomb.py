# attack: res_fork_bomb
# category: resource
# attempts: fork children that each fork again (bounded: stops at 4000 processes in all; every child exits after 4 s)
# expect: fork fails with EAGAIN at the cell's process limit well below 4000, or the cell is killed; the host stays responsive
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 15
import errno
import os
import time

LIMIT = 4000
count = 0
failure = None
children = []
while count < LIMIT:
    try:
        pid = os.fork()
    except OSError as e:
        failure = errno.errorcode.get(e.errno, str(e.errno))
        break
    if pid == 0:
        # Grandchildren: each child forks once more, then everything sleeps and exits.
        try:
            if os.fork() == 0:
                time.sleep(4)
                os._exit(0)
        except OSError:
            pass
        time.sleep(4)
        os._exit(0)
    children.append(pid)
    count += 2
if failure is None:
    print("ATTACK-RESULT: escaped created about %d processes without hitting a limit" % count, flush=True)
else:
    print("ATTACK-RESULT: blocked %s after about %d processes" % (failure, count), flush=True)
for pid in children:
    try:
        os.kill(pid, 9)
    except OSError:
        pass
