# attack: sh_write_outside
# category: filesystem
# attempts: create files outside scratch by redirection, touch, cp and mkdir
# expect: every write fails (Permission denied / Read-only / No such file)
# control: yes
# canaries: scratch_escape
n=0
echo x > "{{OUTSIDE_DIR}}/sh-redirect" 2>/dev/null && n=$((n+1))
touch "{{OUTSIDE_DIR}}/sh-touch" 2>/dev/null && n=$((n+1))
echo x > local && cp local "{{OUTSIDE_DIR}}/sh-cp" 2>/dev/null && n=$((n+1))
mkdir "{{OUTSIDE_DIR}}/sh-dir" 2>/dev/null && n=$((n+1))
if [ "$n" -gt 0 ]; then
    echo "ATTACK-RESULT: escaped $n writes landed outside scratch"
else
    echo "ATTACK-RESULT: blocked all writes failed"
fi
