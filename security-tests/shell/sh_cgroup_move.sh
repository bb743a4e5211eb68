# attack: sh_cgroup_move
# category: process
# attempts: move the shell into the root cgroup (leaving any per-cell cgroup limits and tracking)
# expect: the write fails (read-only / permission denied / no cgroupfs in the cell)
# control: yes
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
before=$(grep '^0::' /proc/self/cgroup 2>/dev/null)
moved=""
errs=""
for root in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    if e=$(sh -c 'echo $PPID > "$1/cgroup.procs"' sh "$root" 2>&1); then
        moved="$root"
        break
    fi
    errs="$errs | $e"
done
after=$(grep '^0::' /proc/self/cgroup 2>/dev/null)
if [ -n "$moved" ]; then
    echo "ATTACK-RESULT: escaped moved into $moved ($before -> $after)"
else
    echo "ATTACK-RESULT: blocked${errs}"
fi
