# The hidden test of the fib example: F(10) = 55 (a marker line that appears nowhere else: fib-hidden-test-7f3a)
test "$(cat /root/answer.txt 2>/dev/null)" = 55
