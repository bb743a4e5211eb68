# attack: leak_host_processes
# category: leak
# attempts: enumerate /proc to see host processes: the harness's victim and the supervisor
# expect: the cell's /proc shows only its own processes (PID namespace) or the host pids are inaccessible
# control: yes
# canaries: none
import os

pids = [p for p in os.listdir("/proc") if p.isdigit()]
print("visible pids:", len(pids))
seen = []
for pid, what in (({{VICTIM_PID}}, "victim"), ({{SUPERVISOR_PID}}, "supervisor")):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmd = f.read()
        if cmd:
            seen.append(what)
    except OSError:
        pass
if seen:
    print("ATTACK-RESULT: escaped host processes visible:", ",".join(seen), flush=True)
else:
    print("ATTACK-RESULT: blocked %d pids visible, none of the host's" % len(pids), flush=True)
