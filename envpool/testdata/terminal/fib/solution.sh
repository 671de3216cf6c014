echo 55 > /root/answer.txt
