#!/bin/bash
# The verifier: reward 1 when the task is done, else 0.
mkdir -p /logs/verifier
if cd /app && python3 -c "from calc import add, mul; assert add(2, 3) == 5 and add(-1, 1) == 0 and mul(3, 4) == 12"; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
