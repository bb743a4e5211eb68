# attack: sh_nsenter_supervisor
# category: process
# attempts: nsenter into the supervisor's mount and network namespaces
# expect: fails: no such process (PID namespace), permission denied, or setns EPERM
# control: yes
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
if e=$(nsenter -t {{SUPERVISOR_PID}} -m -n true 2>&1); then
    echo "ATTACK-RESULT: escaped entered the supervisor's namespaces"
else
    echo "ATTACK-RESULT: blocked $e"
fi
