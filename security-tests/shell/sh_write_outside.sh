# attack: sh_write_outside
# category: filesystem
# attempts: create files outside scratch by redirection, touch, cp and mkdir
# expect: every write fails (Permission denied / Read-only / No such file)
# control: yes
# canaries: scratch_escape
n=0
errs=""
try() {
    if e=$("$@" 2>&1); then n=$((n+1)); else errs="$errs | $e"; fi
}
try sh -c 'echo x > "$1"' sh "{{OUTSIDE_DIR}}/sh-redirect"
try touch "{{OUTSIDE_DIR}}/sh-touch"
echo x > local
try cp local "{{OUTSIDE_DIR}}/sh-cp"
try mkdir "{{OUTSIDE_DIR}}/sh-dir"
if [ "$n" -gt 0 ]; then
    echo "ATTACK-RESULT: escaped $n writes landed outside scratch"
else
    echo "ATTACK-RESULT: blocked${errs}"
fi
