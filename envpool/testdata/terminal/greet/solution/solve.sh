echo hello > /root/greeting.txt
