# attack: sh_cgroup_move
# category: process
# attempts: move the shell into the root cgroup (leaving any per-cell cgroup limits and tracking)
# expect: the write fails (read-only / permission denied / no cgroupfs in the cell)
# control: yes
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
before=$(cat /proc/self/cgroup 2>/dev/null | grep '^0::')
moved=""
for root in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    if [ -w "$root/cgroup.procs" ] && echo $$ > "$root/cgroup.procs" 2>/dev/null; then
        moved="$root"
        break
    fi
done
after=$(cat /proc/self/cgroup 2>/dev/null | grep '^0::')
if [ -n "$moved" ]; then
    echo "ATTACK-RESULT: escaped moved into $moved ($before -> $after)"
else
    echo "ATTACK-RESULT: blocked cgroup.procs not writable"
fi
