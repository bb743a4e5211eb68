# attack: sh_dev_kmsg
# category: filesystem
# attempts: read a record from /dev/kmsg with dd (non-blocking)
# expect: No such file or Permission denied
# control: yes
# canaries: none
if e=$(dd if=/dev/kmsg of=/dev/null bs=8192 count=1 iflag=nonblock 2>&1); then
    echo "ATTACK-RESULT: escaped read /dev/kmsg"
else
    case "$e" in
        *"Resource temporarily"*) echo "ATTACK-RESULT: escaped opened /dev/kmsg" ;;
        *) echo "ATTACK-RESULT: blocked $e" ;;
    esac
fi
