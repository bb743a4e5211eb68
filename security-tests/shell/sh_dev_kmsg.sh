# attack: sh_dev_kmsg
# category: filesystem
# attempts: read a record from /dev/kmsg with dd (non-blocking)
# expect: No such file or Permission denied
# control: yes
# canaries: none
if dd if=/dev/kmsg of=/dev/null bs=8192 count=1 iflag=nonblock 2>/dev/null; then
    echo "ATTACK-RESULT: escaped read /dev/kmsg"
elif [ -r /dev/kmsg ] && dd if=/dev/kmsg of=/dev/null bs=8192 count=1 iflag=nonblock 2>&1 | grep -q 'Resource temporarily'; then
    echo "ATTACK-RESULT: escaped opened /dev/kmsg"
else
    echo "ATTACK-RESULT: blocked /dev/kmsg unreadable"
fi
