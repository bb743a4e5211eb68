# attack: sh_mknod
# category: filesystem
# attempts: mknod a character device and a block device in scratch
# expect: Operation not permitted
# control: no
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
n=0
if e1=$(mknod cnode c 1 3 2>&1); then n=$((n+1)); fi
if e2=$(mknod bnode b 7 0 2>&1); then n=$((n+1)); fi
if [ "$n" -gt 0 ]; then
    echo "ATTACK-RESULT: escaped $n device nodes created"
else
    echo "ATTACK-RESULT: blocked $e1 | $e2"
fi
