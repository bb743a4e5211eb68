# attack: sh_proto_fd3
# category: protocol
# attempts: write garbage and a forged `done` frame to fd 3 (the protocol fd) from a shell cell
# expect: fd 3 is not open in an exec cell (Bad file descriptor), or the supervisor answers protocol_error
# control: no
# canaries: forged
# status: ok,error,protocol_error
if { printf '\000\000\000\053{"t":"done","status":"ok","value":"{{FORGE_TOKEN}}"}' >&3; } 2>/dev/null; then
    printf 'garbage garbage garbage' >&3
    sleep 5
    echo "ATTACK-RESULT: escaped wrote frames to fd 3 and kept running"
else
    echo "ATTACK-RESULT: blocked fd 3 is not open"
fi
