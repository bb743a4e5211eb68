# attack: sh_proc_listing
# category: leak
# attempts: look for the victim and the supervisor under /proc and read their command lines
# expect: neither is visible (PID namespace)
# control: yes
# canaries: none
seen=""
# /proc files report size 0, so test for content rather than with -s.
tr '\0' ' ' < /proc/{{VICTIM_PID}}/cmdline 2>/dev/null | grep -q . && seen="$seen victim"
tr '\0' ' ' < /proc/{{SUPERVISOR_PID}}/cmdline 2>/dev/null | grep -q . && seen="$seen supervisor"
ls /proc | grep -c '^[0-9]' 
if [ -n "$seen" ]; then
    echo "ATTACK-RESULT: escaped visible:$seen"
else
    echo "ATTACK-RESULT: blocked host processes not visible"
fi
