# attack: sh_daemon_setsid
# category: process
# attempts: start a setsid'd background shell (its command line carries the run marker) that lives 25 s, detached from the cell's session
# expect: the cell's end kills it (PID namespace / process group); the harness finds no survivor
# control: no
# canaries: none
# status: ok
setsid sh -c 'sleep 25; : {{MARKER}}' </dev/null >/dev/null 2>&1 &
nohup sh -c 'sleep 25; : {{MARKER}}' </dev/null >/dev/null 2>&1 &
# Give them time to leave the cell's process group before the cell ends.
sleep 1
echo "ATTACK-RESULT: attempted daemons started; the survivor check decides"
