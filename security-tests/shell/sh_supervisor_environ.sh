# attack: sh_supervisor_environ
# category: filesystem
# attempts: read the supervisor's /proc/<pid>/environ and /proc/<pid>/cmdline with cat
# expect: No such file (PID namespace) or Permission denied; API_KEY never appears
# control: yes
# canaries: none
if out=$(tr '\0' '\n' 2>&1 < /proc/{{SUPERVISOR_PID}}/environ) && [ -n "$out" ]; then
    echo "$out"
    tr '\0' ' ' < /proc/{{SUPERVISOR_PID}}/cmdline 2>/dev/null
    echo
    echo "ATTACK-RESULT: escaped read the supervisor environment"
else
    echo "ATTACK-RESULT: blocked $out"
fi
