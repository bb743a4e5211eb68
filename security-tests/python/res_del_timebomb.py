# attack: res_del_timebomb
# category: resource
# attempts: a __del__ (and an atexit hook) that runs after the cell's code: it forks a marked child that lives 25 s and then stalls the interpreter's exit for 25 s
# expect: the cell's result comes back and the whole worker tree is killed at the end of the cell; no survivor
# control: no
# canaries: none
# status: ok,timeout
# timeout: 5
import atexit
import os
import time


def spawn_and_stall():
    try:
        if os.fork() == 0:
            try:
                with open("/proc/self/comm", "w") as f:
                    f.write("{{MARKER}}"[:15])
            except OSError:
                pass
            time.sleep(25)
            os._exit(0)
    except OSError:
        pass
    time.sleep(25)


class TimeBomb:
    def __del__(self):
        spawn_and_stall()


bomb = TimeBomb()
atexit.register(spawn_and_stall)
print("ATTACK-RESULT: attempted time bomb armed; the survivor check decides", flush=True)
