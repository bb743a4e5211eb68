# attack: proto_run_cell_fanout
# category: protocol
# attempts: fan out 2000 sub-cells with run_cell from 8 threads at once
# expect: the call budget refuses further sub-cells long before 2000; concurrent calls are serialised or refused, never crash the supervisor
# control: no
# canaries: supervisor_rss
# status: ok,error,limit_exceeded,policy_denied
# timeout: 60
import threading

TOTAL = 2000
done = []
errors = []
lock = threading.Lock()


def worker():
    while True:
        with lock:
            if len(done) + len(errors) >= TOTAL or errors:
                return
        try:
            run_cell("rhai", "1 + 1")
            with lock:
                done.append(1)
        except Exception as e:
            with lock:
                errors.append("%s: %s" % (type(e).__name__, str(e)[:200]))
            return


threads = [threading.Thread(target=worker) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if len(done) >= TOTAL:
    print("ATTACK-RESULT: escaped %d sub-cells ran" % len(done), flush=True)
else:
    print("ATTACK-RESULT: blocked after %d sub-cells: %s" % (len(done), errors[0] if errors else "stopped"), flush=True)
