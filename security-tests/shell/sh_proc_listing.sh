# attack: sh_proc_listing
# category: leak
# attempts: look for the victim and the supervisor under /proc and read their command lines
# expect: neither is visible (PID namespace)
# control: yes
# canaries: none
seen=""
[ -r /proc/{{VICTIM_PID}}/cmdline ] && [ -s /proc/{{VICTIM_PID}}/cmdline ] && seen="$seen victim"
[ -r /proc/{{SUPERVISOR_PID}}/cmdline ] && [ -s /proc/{{SUPERVISOR_PID}}/cmdline ] && seen="$seen supervisor"
ls /proc | grep -c '^[0-9]' 
if [ -n "$seen" ]; then
    echo "ATTACK-RESULT: escaped visible:$seen"
else
    echo "ATTACK-RESULT: blocked host processes not visible"
fi
