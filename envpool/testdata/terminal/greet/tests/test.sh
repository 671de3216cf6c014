# The hidden test of the greet example (newer layout): the reward goes to
# /logs/verifier/reward.txt. Marker: greet-hidden-test-91c2
if [ "$(cat /root/greeting.txt 2>/dev/null)" = hello ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
