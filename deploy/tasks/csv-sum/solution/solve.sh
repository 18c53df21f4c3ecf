#!/bin/bash
set -euo pipefail
python3 -c 'import csv; print(sum(int(r["amount"]) for r in csv.DictReader(open("/app/sales.csv"))))' > /app/total.txt
