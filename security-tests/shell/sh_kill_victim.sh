# attack: sh_kill_victim
# category: process
# attempts: kill -STOP then kill -9 the harness's victim process
# expect: No such process (PID namespace) or Operation not permitted
# control: yes
# canaries: victim
if e=$(kill -STOP {{VICTIM_PID}} 2>&1) || e=$(kill -9 {{VICTIM_PID}} 2>&1); then
    echo "ATTACK-RESULT: escaped signalled the victim"
else
    echo "ATTACK-RESULT: blocked $e"
fi
