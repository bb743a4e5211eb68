# attack: res_thread_bomb
# category: resource
# attempts: start threads until the limit (bounded: 6000 threads with 64 KiB stacks, each exits after 4 s)
# expect: thread creation fails (RuntimeError from EAGAIN at the process limit, or ENOMEM at the memory limit) well below 6000, or the cell is killed
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 15
import threading
import time

LIMIT = 6000
threading.stack_size(64 * 1024)
count = 0
failure = None
stop = threading.Event()
try:
    while count < LIMIT:
        t = threading.Thread(target=stop.wait, args=(4,), daemon=True)
        t.start()
        count += 1
except (RuntimeError, MemoryError, OSError) as e:
    failure = "%s: %s" % (type(e).__name__, e)
if failure is None:
    print("ATTACK-RESULT: escaped started %d threads" % count, flush=True)
else:
    print("ATTACK-RESULT: blocked %s after %d threads" % (failure, count), flush=True)
stop.set()
