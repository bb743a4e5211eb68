# attack: sh_mount_tmpfs
# category: process
# attempts: mount a tmpfs and bind-mount an empty directory inside scratch (unmounted again at once if it worked)
# expect: mount fails (EPERM; mount is setuid-root, but no_new_privs strips that)
# control: no
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
mkdir -p m b src
n=0
if e1=$(mount -t tmpfs -o size=1m none m 2>&1); then n=$((n+1)); umount m; fi
if e2=$(mount --bind src b 2>&1); then n=$((n+1)); umount b; fi
if [ "$n" -gt 0 ]; then
    echo "ATTACK-RESULT: escaped $n mounts succeeded"
else
    echo "ATTACK-RESULT: blocked $e1 | $e2"
fi
